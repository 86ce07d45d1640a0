"""``pip`` as tests/integration/test_docs_commands.py puts it on the PATH of the docs'
commands: it installs nothing, and checks that what a ``pip install ...`` of the docs asks
for is already there.

The tests run in an environment made before them (``pip install '.[test]'``); a command
of the docs such as ``pip install '.[docs]' && mkdocs build --strict`` runs as written
with this in pip's place, and fails, saying what is missing, where pip would have had
something to install. Arguments: ``install [-e] [--no-build-isolation] TARGET...``, a
TARGET being ``.`` or ``.[EXTRA,...]`` (this source tree: loadgen importable and each
extra's requirements installed, from pyproject.toml) or a requirement like ``aiperf==0.13.0``.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import List

from packaging.requirements import Requirement

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
FLAGS = ("-e", "--editable", "--no-build-isolation", "-q", "--quiet")


def missing(requirement: str, extras: tuple = ("",)) -> List[str]:
    """What of ``requirement`` is not installed (nothing when its marker excludes this
    Python for every one of ``extras``)."""
    req = Requirement(requirement)
    if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras):
        return []
    try:
        have = version(req.name)
    except PackageNotFoundError:
        return [f"{req} (not installed)"]
    return [] if req.specifier.contains(have, prereleases=True) else [f"{req} (installed: {have})"]


def missing_for_tree(target: str) -> List[str]:
    extras = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", target)
    assert extras is not None
    if importlib.util.find_spec("loadgen") is None:
        return ["loadgen (this tree: not importable)"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    out = []
    for extra in (extras.group(1) or "").split(","):
        if extra and extra not in project["optional-dependencies"]:
            return [f".[{extra}]: pyproject.toml has no extra {extra!r}"]
        reqs = project["optional-dependencies"][extra] if extra else project["dependencies"]
        out += [m for r in reqs for m in missing(r, (extra,))]
    return out


def main(argv: List[str]) -> int:
    if not argv or argv[0] != "install":
        print(f"pip (tests/doc_pip.py): only 'pip install' is known here, not {argv}", file=sys.stderr)
        return 2
    targets = [a for a in argv[1:] if a not in FLAGS]
    if not targets or any(t.startswith("-") for t in targets):
        print(f"pip (tests/doc_pip.py): cannot check {argv}", file=sys.stderr)
        return 2
    gone = [m for t in targets for m in (missing_for_tree(t) if t.startswith(".") else missing(t))]
    for m in gone:
        print(f"pip (tests/doc_pip.py): the test environment lacks {m}; it installs nothing", file=sys.stderr)
    if not gone:
        print(f"Requirement already satisfied: {' '.join(targets)}")
    return 1 if gone else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
