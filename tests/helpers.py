"""What the tests share: the CLI as a bounded subprocess (``run_cli``, ``run_json``,
``run_cli_peak``), the environment it gets (``clean_env``), and a small HTTP/1.1 server
thread on 127.0.0.1 (``_Server``, ``_send``, ``kserve``) whose answers a test scripts.

Tests import it as ``from tests.helpers import run_cli``. Every subprocess runs from the
test's own folder (tests/conftest.py), so it imports the installed loadgen, never the
source tree, unless a test passes another ``cwd``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent  # the repository root
RELAXED = ["--max-issue-delay-ms", "100"]
HIGHEST = 3_600_000_000_000  # hdrh's reference histogram range for log reading


# ---------------------------------------------------------------------------- the CLI

def clean_env(**extra: str) -> Dict[str, str]:
    """The environment without any LOADGEN_* variable of the caller's, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOADGEN_")}
    env.update(extra)
    return env


def run_cli(*args: object, timeout: float = 90, env: Optional[Dict[str, str]] = None,
            cwd: Optional[Any] = None, **kwargs: Any) -> subprocess.CompletedProcess:
    """Runs ``python -m loadgen ARGS`` to the end (bounded by ``timeout``) with
    :func:`clean_env` unless ``env`` is given, from ``cwd`` (by default the test's own
    folder); ``kwargs`` go to :func:`subprocess.run` (``input``, ``preexec_fn``)."""
    cmd = [sys.executable, "-m", "loadgen", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=env if env is not None else clean_env(), cwd=cwd, **kwargs)


def run_json(*args: object, expect: Optional[int] = None, **kw: Any) -> Tuple[subprocess.CompletedProcess, dict]:
    """Runs ``loadgen run --json ARGS``; returns (process, result document)."""
    proc = run_cli("run", "--json", *args, **kw)
    assert proc.returncode in (0, 1), f"exit {proc.returncode}\n{proc.stderr}"
    doc = json.loads(proc.stdout)  # --json: the document and nothing else on stdout
    if expect is not None:
        assert proc.returncode == expect, (doc["invalid_reasons"], doc["thresholds"], proc.stderr)
    return proc, doc


def assert_counts_add_up(c: dict) -> None:
    assert c["issued"] == c["completed"] + c["failed"] + c["timed_out"] + c["cancelled"], c
    assert c.get("outstanding", 0) == 0, c


def net_client_engine(net: Any) -> Any:
    """A ``_core.Engine`` whose SUT is the native network client with settings ``net``
    (one query at 10/s), not started: the client's settings are checked as it is made,
    and nothing connects before the run."""
    from loadgen import _core

    sut = _core.NativeSutSettings(kind=_core.SutKind.net_client)
    sut.net = net
    s = _core.EngineSettings()
    s.target_qps = 10.0
    s.max_query_count = 1
    s.sut = sut
    return _core.Engine(s)


def write(path: Path, text: str) -> Path:
    """Writes ``text`` (dedented) to ``path``; returns ``path``."""
    path.write_text(textwrap.dedent(text))
    return path


def read_hdrh_log(path: Path) -> list:
    """The interval histograms of an HdrHistogram log, as the reference ``hdrh`` reads them."""
    hdrh_histogram = pytest.importorskip("hdrh.histogram")
    hdrh_log = pytest.importorskip("hdrh.log")
    reader = hdrh_log.HistogramLogReader(str(path), hdrh_histogram.HdrHistogram(1, HIGHEST, 3))
    out = []
    try:
        while True:
            h = reader.get_next_interval_histogram()
            if h is None:
                return out
            out.append(h)
    finally:
        reader.close()


def run_cli_peak(tmp_path: Path, *args: object, timeout: float = 60, cwd: Optional[Path] = None,
            preexec_fn: Optional[Callable[[], None]] = None) -> Tuple[int, str, str, int]:
    """(exit code, stdout, stderr, peak RSS in KiB) of ``python -m loadgen ARGS`` (from
    ``cwd``; ``preexec_fn`` runs in the child before it starts, to set its limits)."""
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(out, "wb") as fo, open(err, "wb") as fe:
        proc = subprocess.Popen([sys.executable, "-m", "loadgen", *map(str, args)], stdout=fo, stderr=fe,
                                env=clean_env(), cwd=cwd, preexec_fn=preexec_fn)
    deadline = time.monotonic() + timeout
    # The child's own high-water mark, read while it runs: VmHWM belongs to the process's
    # memory since exec. (wait4's ru_maxrss would not do: Linux carries the forking
    # parent's peak, here the whole test session's, across exec into the child's figure.)
    peak_kib = 0
    while True:
        peak_kib = max(peak_kib, _vm_hwm_kib(proc.pid))
        pid, status, _ = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            pytest.fail(f"loadgen {' '.join(map(str, args))} ran past {timeout} s")
        time.sleep(0.02)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here; keep Popen from waiting again
    return proc.returncode, out.read_text(), err.read_text(), peak_kib


def _vm_hwm_kib(pid: int) -> int:
    """Peak resident memory of a running process in KiB (0 once it has exited)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0




# --------------------------------------------------------------------- the test server

METADATA = {"name": "m", "versions": ["1"], "platform": "test",
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 4]}]}
GOOD = {"model_name": "m", "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 4],
                                        "data": [1.0, 2.0, 3.0, 4.0]}]}


# --------------------------------------------------------------------- the test server

class _Server:
    """An HTTP/1.1 server on 127.0.0.1: ``route(method, path, head, sock)`` answers each
    request (writing to ``sock`` itself) and returns whether the connection stays open."""

    def __init__(self, route: Callable[[str, str, bytes, socket.socket], bool]) -> None:
        self.route = route
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.heads: List[bytes] = []
        self.closed_by_client = 0
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, daemon=True)
        self._accept.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._connection, args=(sock,), daemon=True)
            t.start()
            self._threads.append(t)

    def _connection(self, sock: socket.socket) -> None:
        sock.settimeout(10)
        buf = b""
        try:
            while not self._stop.is_set():
                while b"\r\n\r\n" not in buf:
                    data = sock.recv(65536)
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buf) < length:
                    data = sock.recv(65536)
                    if not data:
                        return
                    buf += data
                buf = buf[length:]
                self.heads.append(head)
                method, path = head.split(b" ")[:2]
                if not self.route(method.decode(), path.decode(), head, sock):
                    return
        except (BrokenPipeError, ConnectionResetError):
            self.closed_by_client += 1
        except OSError:
            pass
        finally:
            sock.close()

    def stop(self) -> None:
        self._stop.set()
        self.listener.close()
        self._accept.join(5)
        for t in self._threads:
            t.join(5)


def _send(sock: socket.socket, status: int, body: bytes, headers: Tuple[str, ...] = (),
          content_type: str = "application/json") -> bool:
    head = [f"HTTP/1.1 {status} X", f"Content-Type: {content_type}", f"Content-Length: {len(body)}", *headers]
    sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    return True


def _forever(sock: socket.socket, piece: bytes) -> bool:
    """Sends ``piece`` until the client closes (or 30 s pass)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        sock.sendall(piece)
    return False


def kserve(infer: Callable[[bytes, socket.socket], bool]):
    """A KServe v2 server for model ``m`` (ready, with metadata) whose infer answer is
    ``infer(request head, sock)``."""
    def route(method: str, path: str, head: bytes, sock: socket.socket) -> bool:
        if path in ("/v2/health/ready", "/v2/models/m/ready"):
            return _send(sock, 200, b"")
        if path == "/v2/models/m":
            return _send(sock, 200, json.dumps(METADATA).encode())
        if path == "/v2/models/m/infer" and method == "POST":
            return infer(head, sock)
        return _send(sock, 404, b"{}")
    return route




def kserve_url(server: _Server) -> str:
    return f"http://127.0.0.1:{server.port}/v2/models/m/infer"


@contextlib.contextmanager
def turnstile(folder: Path, alone: bool) -> Iterator[None]:
    """Holds the run's test lock in ``folder`` (shared by the xdist workers of one run):
    shared by every test, exclusive by one that runs alone. A test passes the gate lock
    first and lets go of it once it holds the test lock, except one that runs alone, which
    keeps it to its end: so a test waiting to run alone is not passed over by the others'
    shared locks, which would overlap for ever."""
    with open(folder / "tests.gate", "a") as gate, open(folder / "tests.lock", "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield  # both are let go of when the files close
