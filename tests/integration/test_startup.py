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

REPO = Path(__file__).resolve().parents[2]  # the source tree, whether or not loadgen is installed from it
HEAVY = ("numpy", "loadgen._core", "loadgen.engine", "loadgen.options", "loadgen.results", "asyncio")
# What a one-request run needs none of: numpy (the native extension imports it where a record
# dtype or an array is used), asyncio (the loop SUTs' driver and the asyncio HTTP client),
# pynvml (on a machine with no NVIDIA driver), ssl (no https:// target).
NOT_IN_A_RUN = ("numpy", "asyncio", "ssl", "loadgen.net.http1")
ONE_REQUEST = ["run", "--scenario", "concurrency", "--concurrency", "1", "--query-count", "1", "--json", "--quiet",
               "--interval-s", "0"]

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
    env = _env_without_blas_threads()
    p, got = probe(tmp_path, *ONE_REQUEST, env=env)
    assert p.returncode == 0, p.stderr
    assert got["blas"] == "1"  # set before anything could load numpy
    p, got = probe(tmp_path, *ONE_REQUEST, env={**env, "OMP_NUM_THREADS": "3"})
    assert p.returncode == 0, p.stderr
    assert got["blas"] is None  # the user's choice stands
    p, got = probe(tmp_path, *ONE_REQUEST, env={**env, "OPENBLAS_NUM_THREADS": "2"})
    assert got["blas"] == "2"


def _no_nvidia_driver() -> bool:
    from loadgen.telemetry.gpu_backend import _driver_present

    return not _driver_present()


def _check_one_request_run(tmp_path: Path, *args: str) -> set:
    """The modules a one-request run loaded, after checking that its request completed."""
    p, got = probe(tmp_path, *ONE_REQUEST, *args)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["counts"]["completed"] == 1
    modules = set(got["modules"])
    assert {"loadgen.engine", "loadgen._core", "loadgen.results"} <= modules  # a real run went through
    assert not modules & set(NOT_IN_A_RUN), sorted(modules & set(NOT_IN_A_RUN))
    if _no_nvidia_driver():
        assert "pynvml" not in modules  # the GPU sampler looked for a driver without it
    return modules


def test_a_one_request_null_run_loads_no_numpy_asyncio_or_nvml(tmp_path):
    _check_one_request_run(tmp_path, "--sut", "null")


def test_a_one_request_http_run_loads_no_numpy_or_asyncio(tmp_path):
    """Over HTTP with a JSON body: the native client, the readiness and metadata GETs on
    a plain socket (loadgen.net.blocking_get), no tensor made in Python."""
    from tests.servers.scripted_proc import start_scripted

    body = tmp_path / "body.jsonl"
    body.write_text(json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16],
                                            "data": [float(i) for i in range(16)]}]}) + "\n")
    with start_scripted(tmp_path) as srv:
        modules = _check_one_request_run(tmp_path, "--sut", f"{srv.url}/v2/models/m/infer", "--payload", str(body))
        assert srv.stats()["requests"]["infer"] == 1  # the server saw the one request
    assert {"loadgen.net.native", "loadgen.net.blocking_get"} <= modules


def test_the_record_dtype_loads_numpy_on_first_use():
    """Loading the native extension imports no numpy; its record dtype is made (and numpy
    imported) when first read, and is the same object after."""
    code = ("import sys, loadgen._core as c; before = 'numpy' in sys.modules; d = c.record_dtype\n"
            "print(before, 'numpy' in sys.modules, d.itemsize, d is c.record_dtype, 'record_dtype' in dir(c),"
            " hasattr(c, 'record_dtypes'))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["False", "True", "64", "True", "True", "False"]


_NVML_PROBE = """
import sys
from loadgen.telemetry import gpu_backend
gpu_backend._DRIVER_PATHS = (sys.argv[1],)
try:
    gpu_backend.NvmlBackend().init()
    print("started")
except gpu_backend.GpuUnavailable as e:
    print(e)
print("pynvml" in sys.modules)
"""


def test_nvml_is_imported_only_where_a_driver_may_be(tmp_path):
    pytest.importorskip("pynvml")
    if sys.platform != "linux":
        pytest.skip("the driver check is Linux's")

    def init_with_driver_path(path: Path) -> list:
        p = subprocess.run([sys.executable, "-c", _NVML_PROBE, str(path)], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0, p.stderr
        return p.stdout.splitlines()

    reason, imported = init_with_driver_path(tmp_path / "absent")
    assert reason == f"NVML could not start: Driver Not Loaded (no NVIDIA driver: none of {tmp_path / 'absent'} exists)"
    assert imported == "False"
    reason, imported = init_with_driver_path(tmp_path)  # a path that exists: NVML itself is asked
    assert imported == "True"
    assert reason == "started" or reason.startswith("NVML could not start: ")
