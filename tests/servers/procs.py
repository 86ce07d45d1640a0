"""Starting, probing and ending the server processes of the network tests.

Every process is started here with its own PID recorded and is ended by that PID only
(SIGTERM, then SIGKILL after a grace period). Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from typing import Dict, Iterator, List, Optional, Sequence

__all__ = ["ServerProcess", "ServerUnavailable", "free_port", "get_json", "http_get", "install_lock", "install_server", "post_json",
           "require_servers", "wait_for_count", "check_add_one_over_rest"]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_INSTALLED: Dict[str, Optional[str]] = {}


class ServerUnavailable(RuntimeError):
    """A server the tests need is not installed here; the message says how to install it."""


def require_servers() -> bool:
    """True when missing servers must fail the tests instead of skipping them (CI sets
    LOADGEN_REQUIRE_SERVERS=1 after installing them)."""
    return os.environ.get("LOADGEN_REQUIRE_SERVERS", "") not in ("", "0")


def native_grpc_or_skip() -> None:
    """Skips the calling test where this build has no native gRPC client (built without
    nghttp2's header); fails it instead where servers are required (CI installs
    libnghttp2-dev and builds with LOADGEN_NGHTTP2=1)."""
    import pytest

    from loadgen import _core

    if _core.grpc_client_available():
        return
    why = "this build has no native gRPC client (install libnghttp2-dev and reinstall loadgen)"
    if require_servers():
        pytest.fail(why)
    pytest.skip(why)


def post_json(url: str, body: dict, timeout_s: float = 10.0) -> dict:
    """POSTs ``body`` as JSON; the JSON answer (asserting status 200)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        assert response.status == 200
        return json.loads(response.read())


def get_json(url: str, timeout_s: float = 10.0) -> dict:
    """GETs ``url``; the JSON answer (asserting status 200)."""
    status, body = http_get(url, timeout_s)
    assert status == 200, body
    return json.loads(body)


def wait_for_count(count, expected: int, timeout_s: float = 5.0) -> int:
    """``count()`` once it reaches ``expected``, or the last value read after timeout_s (a
    server may record a request just after its response went out)."""
    deadline = time.monotonic() + timeout_s
    got = count()
    while got < expected and time.monotonic() < deadline:
        time.sleep(0.05)
        got = count()
    return got


def check_add_one_over_rest(http_url: str, n_requests: int) -> dict:
    """Sends n KServe v2 JSON requests to the add_one model (INPUT0 FP32 [1, 16]), checks
    each answer is OUTPUT0 = INPUT0 + 1, and returns the model's metadata."""
    for i in range(n_requests):
        data = [float(i * 16 + j) / 4 for j in range(16)]
        reply = post_json(f"{http_url}/v2/models/add_one/infer", {
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": data}]})
        assert reply["model_name"] == "add_one"
        [output] = reply["outputs"]
        assert output["name"] == "OUTPUT0"
        assert output["datatype"] == "FP32"
        assert output["shape"] == [1, 16]
        assert output["data"] == [x + 1 for x in data]
    meta = get_json(f"{http_url}/v2/models/add_one")
    assert meta["name"] == "add_one"
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16]}]
    assert meta["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16]}]
    return meta


@contextlib.contextmanager
def install_lock(name: str) -> Iterator[None]:
    """Holds ``<repo>/.servers/<name>.lock`` (an exclusive ``flock``) while installing
    ``name``: the test processes of one run (pytest-xdist's workers) each ask for the
    servers they use, and the second one waits for the first one's install instead of
    writing into the same folder at the same time, then finds it there."""
    os.makedirs(os.path.join(REPO, ".servers"), exist_ok=True)
    with open(os.path.join(REPO, ".servers", f"{name}.lock"), "wb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        yield


def install_server(name: str, timeout_s: float = 900.0) -> Optional[str]:
    """The virtual environment ``<repo>/.servers/<name>`` holding a test server, made by
    ``tests/servers/install_<name>.sh`` when first asked for in this process (the script
    returns at once when the install is already there; :func:`install_lock` keeps two
    processes from running it at once). None when LOADGEN_TEST_NO_INSTALL is set and there
    is no install, or when installing failed (the reason is kept in
    ``<repo>/.servers/<name>.install.log``)."""
    if name in _INSTALLED:
        return _INSTALLED[name]
    dest = os.path.join(REPO, ".servers", name)
    if os.environ.get("LOADGEN_TEST_NO_INSTALL", "") not in ("", "0"):
        _INSTALLED[name] = dest if os.path.isdir(dest) else None
        return _INSTALLED[name]
    with install_lock(name):
        _INSTALLED[name] = _run_install_script(name, dest, timeout_s)
    return _INSTALLED[name]


def _run_install_script(name: str, dest: str, timeout_s: float) -> Optional[str]:
    """Runs ``tests/servers/install_<name>.sh DEST``, its output in ``DEST.install.log``;
    ``dest`` when it succeeded, else None."""
    script = os.path.join(REPO, "tests", "servers", f"install_{name}.sh")
    log_path = dest + ".install.log"
    with open(log_path, "wb") as log:
        try:
            rc = subprocess.run(["bash", script, dest], stdout=log, stderr=subprocess.STDOUT,
                                timeout=timeout_s, cwd=REPO).returncode
        except subprocess.TimeoutExpired:
            rc = -1
    return dest if rc == 0 else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout_s: float = 2.0) -> tuple:
    """(status, body bytes) of a GET; status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (OSError, urllib.error.URLError):
        return 0, b""


class ServerProcess:
    """One server process started by a test, with its output kept in a log file.

    Args:
        argv: the command.
        log_path: where stdout and stderr go.
        env: extra environment variables.
        cwd: working directory.
    """

    def __init__(self, argv: Sequence[str], log_path: str, env: Optional[Dict[str, str]] = None,
                 cwd: Optional[str] = None) -> None:
        self.argv: List[str] = list(argv)
        self.log_path = log_path
        full_env = dict(os.environ)
        full_env.update(env or {})
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=full_env, cwd=cwd, start_new_session=True)
        self.pid = self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n_bytes: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - n_bytes))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def wait_http_ok(self, url: str, timeout_s: float) -> None:
        """Waits until GET url answers 200; raises RuntimeError with the log's tail if the
        process dies or the time runs out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.argv[0]} exited with {self.proc.returncode} before {url} "
                                   f"answered; log tail:\n{self.log_tail()}")
            if http_get(url, 1.0)[0] == 200:
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{url} did not answer 200 within {timeout_s:g} s; log tail:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL, now (the process only: a server killed mid-run)."""
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after grace_s; also ends the children the server started
        in its own session (Triton's Python-backend stubs, MLServer's workers)."""
        if self.alive():
            try:
                os.killpg(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        # The group is the session this object started (start_new_session): only our own.
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()
