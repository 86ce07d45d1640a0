"""Static checks of the source: ruff's rule set over the package, the tests and the
benchmarks, and mypy over the package, both configured in pyproject.toml. They run on the
source tree beside these tests, so that CI checks what is committed."""

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(
    not os.path.exists(os.path.join(ROOT, "pyproject.toml")), reason="needs the source tree"
)


def _run(args):
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)


RUFF_PATHS = ("loadgen", "tests", "bench")


def test_ruff_finds_nothing_in_the_package_tests_and_benchmarks():
    ruff = shutil.which("ruff") or os.path.join(os.path.dirname(sys.executable), "ruff")
    assert os.path.exists(ruff), "ruff is not installed (pip install '.[test]')"
    for path in RUFF_PATHS:  # a folder that went missing would pass unchecked
        assert os.path.isdir(os.path.join(ROOT, path)), path
    done = _run([ruff, "check", "--no-cache", *RUFF_PATHS])
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_finds_nothing_in_the_package():
    assert importlib.util.find_spec("mypy"), "mypy is not installed (pip install '.[test]')"
    done = _run([sys.executable, "-m", "mypy", "--cache-dir", os.path.join(ROOT, ".mypy_cache")])
    assert done.returncode == 0, done.stdout + done.stderr
