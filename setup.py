"""Build of loadgen's native core, the extension module ``loadgen._core``.

Every C++ source under csrc/ (plain C++17, no Python; subfolders such as csrc/mlperf/
included) and in bindings/ (pybind11) is compiled into the one extension. Headers are
listed in ``depends`` so that editing one rebuilds.
"""

from glob import glob

from pybind11.setup_helpers import Pybind11Extension
from setuptools import setup

sources = sorted(glob("csrc/**/*.cc", recursive=True)) + sorted(glob("bindings/*.cc"))
headers = sorted(glob("csrc/**/*.h", recursive=True)) + sorted(glob("bindings/*.h"))

ext = Pybind11Extension(
    "loadgen._core",
    sources,
    include_dirs=["csrc"],
    depends=headers,
    cxx_std=17,
    extra_compile_args=["-O3", "-Wall", "-Wextra", "-fvisibility=hidden"],
    libraries=["z"],
)

setup(ext_modules=[ext])
