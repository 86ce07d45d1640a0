"""The native truth server (``tests/servers/truth_server.cc``): built with g++ on first use
into ``.servers/truth_server/``, started as a process of its own.

It serves the OpenAI chat-completions stream of ``scripted.py`` with the same timing and
the same ``GET /stats`` record, from C++ on one thread (epoll, a timer heap on
CLOCK_MONOTONIC), so that it writes on time at thousands of streams, where the Python
server falls behind. Each stream's record also holds its writes' lateness
(``write_late_ns``: write time - due time).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

from .procs import REPO, install_lock
from .scripted_proc import Scripted, start_with_port_line

__all__ = ["TruthServerUnavailable", "build_truth_server", "start_truth_server"]

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "truth_server.cc")
BUILD_DIR = os.path.join(REPO, ".servers", "truth_server")
BINARY = os.path.join(BUILD_DIR, "truth_server")
CXXFLAGS = ("-std=c++17", "-O2", "-Wall", "-Wextra")


class TruthServerUnavailable(RuntimeError):
    """The native truth server cannot be built here (no g++, or the build failed)."""


def build_truth_server(timeout_s: float = 300.0) -> str:
    """The server's binary, compiled first when missing or older than its source (one
    process at a time: the others wait for the first one's build, then find it there).

    Raises:
        TruthServerUnavailable: g++ is not installed, or the compile failed (its output
            says why).
    """
    with install_lock("truth_server"):
        if os.path.exists(BINARY) and os.path.getmtime(BINARY) >= os.path.getmtime(SOURCE):
            return BINARY
        cxx = shutil.which("g++")
        if cxx is None:
            raise TruthServerUnavailable("the native truth server needs g++ to build "
                                         "(apt-get install g++), or use the Python server")
        os.makedirs(BUILD_DIR, exist_ok=True)
        partial = f"{BINARY}.{os.getpid()}.partial"
        r = subprocess.run([cxx, *CXXFLAGS, "-o", partial, SOURCE], capture_output=True, text=True,
                           timeout=timeout_s)
        if r.returncode != 0:
            raise TruthServerUnavailable(f"g++ could not build {SOURCE}: {(r.stderr or r.stdout)[-1500:]}")
        os.replace(partial, BINARY)  # whole or not at all: a reader never runs half a file
        return BINARY


def start_truth_server(tmp_path: Any, *args: object, timeout_s: float = 10) -> Scripted:
    """Builds the server if needed, starts ``truth_server --port 0 *args`` (the options of
    the head of truth_server.cc) with its log in tmp_path, and waits at most timeout_s for
    its port; the running server (its URL, PID, ``stats()``, ``stop()``)."""
    return start_with_port_line([build_truth_server()], tmp_path, "truth_server", *args, timeout_s=timeout_s)
