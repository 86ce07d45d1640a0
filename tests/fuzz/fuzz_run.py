"""Coverage-guided fuzzing of one target of targets.py with atheris (libFuzzer).

    python tests/fuzz/fuzz_run.py TARGET [libFuzzer arguments and corpus dirs]
    python tests/fuzz/fuzz_run.py --list

loadgen's Python modules (and the targets) are imported under atheris's instrumentation,
so the fuzzer is guided by the branches of the parsers it feeds, not blind. A crash
(an exception the target does not expect) stops the run with a non-zero status and
leaves the input as a crash-* file under -artifact_prefix. scripts/fuzz.sh runs every
target for a bounded time.
"""

from __future__ import annotations

import os
import sys

import atheris

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

with atheris.instrument_imports(include=["loadgen", "targets"]):
    import targets


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in targets.TARGETS and sys.argv[1] != "--list":
        sys.exit(f"usage: {sys.argv[0]} TARGET|--list [libFuzzer args]; targets: {', '.join(targets.TARGETS)}")
    if sys.argv[1] == "--list":
        print("\n".join(targets.TARGETS))
        return
    target = targets.TARGETS[sys.argv[1]]
    sys.setrecursionlimit(1000)  # the interpreter's default, whatever the harness set
    atheris.Setup([sys.argv[0]] + sys.argv[2:], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
