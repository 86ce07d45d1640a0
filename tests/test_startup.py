"""Start-up: what the command line and ``import loadgen`` import. ``--version`` and
``--help`` load neither numpy nor the native extension; the package's public names load on
first use and are the same objects as before; an unbuilt tree still says how to build it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import loadgen

REPO = Path(loadgen.__file__).resolve().parent.parent
HEAVY = ("numpy", "loadgen._core", "loadgen.engine", "loadgen.options", "loadgen.results", "asyncio")

# Runs the command line as `python -m loadgen ARGS` does, and writes the names of the
# modules loaded when the interpreter exits (after argparse's SystemExit) to PATH, and
# the OpenBLAS thread count the process had then.
_PROBE = """
import atexit, json, os, runpy, sys
path, args = sys.argv[1], sys.argv[2:]
atexit.register(lambda: open(path, "w").write(json.dumps(
    {"modules": sorted(sys.modules), "blas": os.environ.get("OPENBLAS_NUM_THREADS")})))
sys.argv = ["loadgen"] + args
runpy.run_module("loadgen", run_name="__main__", alter_sys=True)
"""


def probe(tmp_path: Path, *args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "probe.json"
    p = subprocess.run([sys.executable, "-c", _PROBE, str(out), *args], capture_output=True, text=True,
                       timeout=120, env=env)
    return p, json.loads(out.read_text())


def modules_loaded_by(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, set]:
    p, got = probe(tmp_path, *args)
    return p, set(got["modules"])


@pytest.mark.parametrize("args, code, says", [
    (["--version"], 0, f"loadgen {loadgen.__version__}"),
    (["--help"], 0, "run one benchmark"),
    ([], 2, "COMMAND"),  # no command: the help, exit 2
    (["rnu"], 2, "invalid choice: 'rnu'"),
])
def test_version_and_help_import_neither_numpy_nor_the_core(tmp_path, args, code, says):
    p, modules = modules_loaded_by(tmp_path, *args)
    assert p.returncode == code, p.stderr
    assert says in p.stdout + p.stderr
    assert "loadgen.cli" in modules  # the probe ran the command line
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))


def test_a_command_imports_its_own_module_only(tmp_path):
    p, modules = modules_loaded_by(tmp_path, "hlog", "--help")
    assert p.returncode == 0, p.stderr
    assert "loadgen.cli.report" in modules  # hlog's module
    assert not {"loadgen.cli.run", "loadgen.cli.sweep", "loadgen.cli.find_peak"} & modules


def test_import_loadgen_loads_nothing_heavy():
    code = "import sys, json, loadgen; print(json.dumps(sorted(sys.modules)))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert not set(json.loads(p.stdout)) & set(HEAVY)


def test_every_public_name_resolves_to_its_module_object():
    code = """
import importlib, json, loadgen
from loadgen import _LAZY
out = {}
for name in loadgen.__all__:
    value = getattr(loadgen, name)
    home = _LAZY.get(name)
    out[name] = home is None or value is getattr(importlib.import_module(home), name)
print(json.dumps({"same": out, "dir": sorted(dir(loadgen))}))
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert set(loadgen.__all__) <= set(got["dir"])
    assert set(got["same"]) == set(loadgen.__all__)
    assert all(got["same"].values()), [n for n, same in got["same"].items() if not same]
    assert {"Histogram", "run", "Result", "load_results", "__version__"} <= set(loadgen.__all__)


def test_from_imports_work_as_before():
    code = ("from loadgen import Histogram, EngineSettings, NullSUT, Result, read_log, run, _core\n"
            "h = Histogram(); h.record(5); assert h.total_count == 1\n"
            "assert callable(run) and callable(read_log) and hasattr(_core, 'Engine')\n"
            "import loadgen; assert loadgen.Histogram is Histogram and loadgen.Result is Result\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Histgram'"):
        loadgen.Histgram  # noqa: B018
    with pytest.raises(ImportError):
        exec("from loadgen import Histgram", {})


def test_the_help_lines_are_the_commands_own():
    """`loadgen --help` lists each command with the line its module registers."""
    import argparse

    from loadgen.cli import COMMANDS, _build_parser

    lines = {}
    for name in COMMANDS:
        parser, commands = _build_parser(name)
        assert name in commands
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        lines.update({a.dest: a.help for a in sub._choices_actions})
    assert lines == {name: help_line for name, (_, help_line) in COMMANDS.items()}


def _unbuilt_tree(tmp_path: Path) -> Path:
    """A copy of the source tree without the native extension: the package and setup.py."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "loadgen", src / "loadgen",
                    ignore=shutil.ignore_patterns("_core*.so", "_core*.pyd", "__pycache__"))
    shutil.copy(REPO / "setup.py", src / "setup.py")
    return src


def test_the_unbuilt_tree_error_names_the_fix(tmp_path):
    src = _unbuilt_tree(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=60, cwd=src,
                              env=env)

    p = run("-c", "import loadgen; print(loadgen.__file__)")  # the copy is the one imported
    assert p.returncode == 0 and p.stdout.startswith(str(src)), p.stdout + p.stderr
    assert run("-m", "loadgen", "--version").stdout.strip() == f"loadgen {loadgen.__version__}"
    for argv in (["-c", "from loadgen import Histogram"], ["-c", "import loadgen; loadgen.Engine"],
                 ["-m", "loadgen", "run", "--sut", "null", "--query-count", "1"]):
        p = run(*argv)
        assert p.returncode != 0, argv
        last = p.stderr.strip().splitlines()[-1]
        assert "loadgen's native extension (loadgen._core) is not available" in last, p.stderr
        assert "unbuilt source tree" in last and "python setup.py build_ext --inplace" in last, last


def _env_without_blas_threads() -> dict:
    from loadgen.cli import BLAS_THREAD_VARIABLES

    return {k: v for k, v in os.environ.items() if k not in BLAS_THREAD_VARIABLES}


def test_a_run_has_one_blas_thread_unless_the_user_chose(tmp_path):
    """numpy's OpenBLAS would start a thread per core, each spinning a while: one, in the
    command line, unless a BLAS thread variable is set."""
    one_request = ["run", "--sut", "null", "--scenario", "concurrency", "--concurrency", "1",
                   "--query-count", "1", "--quiet"]
    env = _env_without_blas_threads()
    p, got = probe(tmp_path, *one_request, env=env)
    assert p.returncode == 0, p.stderr
    assert "numpy" in got["modules"] and got["blas"] == "1"
    p, got = probe(tmp_path, *one_request, env={**env, "OMP_NUM_THREADS": "3"})
    assert p.returncode == 0, p.stderr
    assert got["blas"] is None  # the user's choice stands
    p, got = probe(tmp_path, *one_request, env={**env, "OPENBLAS_NUM_THREADS": "2"})
    assert got["blas"] == "2"
