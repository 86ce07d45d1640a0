"""Starting the scripted test server (``tests/servers/scripted.py``), or another server that
prints its port the same way, as a process of its own."""

from __future__ import annotations

import itertools
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from .procs import ServerProcess, http_get

__all__ = ["Scripted", "start_scripted", "start_with_port_line"]

SCRIPT = Path(__file__).with_name("scripted.py")
_log_numbers = itertools.count()


class Scripted:
    """A running scripted server: its URL, its PID, its record of what it sent."""

    def __init__(self, proc: ServerProcess, port: int, scheme: str = "http") -> None:
        self.proc = proc
        self.port = port
        self.url = f"{scheme}://127.0.0.1:{port}"
        self.pid = proc.pid

    def stats(self, timeout_s: float = 5.0) -> dict[str, Any]:
        """GET /stats: the server's own record (module doc of scripted.py)."""
        status, body = http_get(self.url + "/stats", timeout_s)
        if status != 200:
            raise RuntimeError(f"GET /stats answered {status}; log tail:\n{self.proc.log_tail()}")
        return json.loads(body)

    def stop(self) -> None:
        """SIGTERM (the server exits cleanly), SIGKILL after a grace period."""
        self.proc.stop()

    def kill(self) -> None:
        """SIGKILL, now."""
        self.proc.kill()

    def __enter__(self) -> Scripted:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_scripted(tmp_path: Any, *args: object, timeout_s: float = 10) -> Scripted:
    """Starts ``scripted.py --port 0 *args`` with its log in tmp_path and waits (at most
    timeout_s) for the ``PORT n`` line; raises RuntimeError with the log's tail if the
    process exits first or the time runs out."""
    scheme = "https" if "--tls-cert" in map(str, args) else "http"
    return start_with_port_line([sys.executable, str(SCRIPT)], tmp_path, "scripted", *args, timeout_s=timeout_s,
                                scheme=scheme)


def start_with_port_line(command: list[str], tmp_path: Any, name: str, *args: object, timeout_s: float = 10,
                         scheme: str = "http") -> Scripted:
    """Starts ``command --port 0 *args`` (a server that prints ``PORT n`` once listening and
    serves scripted.py's /stats) with its log in tmp_path as ``<name>-<i>.log``, and waits
    at most timeout_s for that line; raises RuntimeError with the log's tail if the process
    exits first or the time runs out."""
    log = Path(tmp_path) / f"{name}-{next(_log_numbers)}.log"
    proc = ServerProcess([*command, "--port", "0", *map(str, args)], str(log))
    deadline = time.monotonic() + timeout_s
    port: int | None = None
    while port is None:
        match = re.search(rb"^PORT (\d+)$", log.read_bytes(), re.MULTILINE)
        if match:
            port = int(match.group(1))
        elif not proc.alive() or time.monotonic() > deadline:
            proc.stop()
            raise RuntimeError(f"{name} {' '.join(map(str, args))} did not print its port within "
                               f"{timeout_s:g} s (exit code {proc.proc.returncode}); log tail:\n{proc.log_tail()}")
        else:
            time.sleep(0.02)
    return Scripted(proc, port, scheme)
