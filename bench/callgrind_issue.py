"""Instructions per query of the two issue paths, counted by callgrind.

Instruction counts do not move with the load of a shared machine the way wall times do,
so they show what a change to the engine's in-flight table or the MLPerf loop's slot ring
costs per query even on a busy host. Each case runs in a fresh child process under
``valgrind --tool=callgrind``, with collection on only inside one C++ function (and
what it calls), so Python's start-up and the harness are not counted:

  engine        ``Engine::issue_loop`` on the issue thread: a closed loop of concurrency 1
                with the native NullSUT (which completes each query on the issue thread),
                so the count per query covers slot search, fill, publish, completion,
                recording and freeing.
  mlperf        ``time_mlperf_loop``: SingleStream through ``MlperfRun`` with an instant
                C++ SUT that stamps each query's first token and completes it in the issue
                call (slot claim, publish, first-token stamp, completion, recording).
  mlperf_multi  the same with MultiStream queries of 8 samples (one done bit per sample).

Usage: ``python bench/callgrind_issue.py [--queries N]`` (valgrind on the PATH; about a
minute). Prints one line per case: instructions per query.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, Tuple

ROOT = Path(__file__).resolve().parents[1]

CASES: Dict[str, Tuple[str, str]] = {
    "engine": ("loadgen::Engine::issue_loop()",
               "import loadgen; r = loadgen.run(loadgen.EngineSettings(mode='closed', concurrency=1, "
               "query_count={n}, interval_s=0), loadgen.NullSUT()); assert r.counts['completed'] == {n}"),
    "mlperf": ("loadgen::time_mlperf_loop(long, long)",
               "from loadgen import _core; _core.time_mlperf_loop({n}, 1)"),
    "mlperf_multi": ("loadgen::time_mlperf_loop(long, long)",
                     "from loadgen import _core; _core.time_mlperf_loop({n} // 8, 8)"),
}


def count_instructions(function: str, code: str) -> int:
    """Runs ``code`` in a child Python under callgrind, collecting only inside
    ``function``; returns the instructions counted."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no", f"--toggle-collect={function}",
               f"--callgrind-out-file={out}", sys.executable, "-c", code]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
        if proc.returncode != 0:
            raise SystemExit(f"callgrind run failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        match = re.search(r"^summary:\s+(\d+)", out.read_text(), re.MULTILINE)
        if not match:
            raise SystemExit(f"no summary in {out}")
        return int(match.group(1))


def main() -> None:
    """Prints the instructions per query of each case."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=100_000, help="queries per case (default 100000)")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    args = parser.parse_args()
    for name in args.cases.split(","):
        function, code = CASES[name]
        n = args.queries
        queries = n // 8 if name == "mlperf_multi" else n
        total = count_instructions(function, code.format(n=n))
        print(f"{name:13s} {total / queries:10.1f} instructions per query ({total:,} over {queries:,} queries)")


if __name__ == "__main__":
    main()
