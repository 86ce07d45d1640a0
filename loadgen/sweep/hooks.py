"""Per-point hooks: the ``--before-point`` and ``--after-point`` shell commands, run with
the point's values in the environment, bounded in time and in the output kept, and
stopped with the sweep."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import IO, Any, Callable, Dict, Mapping, Optional

from loadgen.sweep.grid import env_name, value_env

__all__ = ["HookResult", "hook_environment", "run_hook"]

#: How much of a hook's stderr a failed point records.
STDERR_TAIL_BYTES = 2000
#: How much of a hook's stdout, and of its stderr, is kept in its log file: the first and
#: the last this many bytes; what lies between is dropped, and counted.
HOOK_OUTPUT_KEEP_BYTES = 64 * 1024
# How long the output of a hook that has ended is still read: a process it left behind,
# outside its process group, may hold its pipes open.
_DRAIN_S = 2.0
# How long a stopped hook's process group gets between SIGTERM and SIGKILL.
_TERM_GRACE_S = 2.0


@dataclass(frozen=True)
class HookResult:
    """How a hook ended: its exit code (None when it was killed for running too long
    or for the sweep's interruption), whether it timed out or was interrupted, how long
    it ran, the tail of its stderr, the files its output went to, and how many bytes of
    each stream were dropped from the middle to keep its log within bounds (see
    :data:`HOOK_OUTPUT_KEEP_BYTES`)."""

    name: str
    command: str
    exit_code: Optional[int]
    timed_out: bool
    interrupted: bool
    wall_s: float
    stderr_tail: str
    logs: Dict[str, str]
    dropped_bytes: Dict[str, int]

    @property
    def ok(self) -> bool:
        """It exited 0 in time."""
        return self.exit_code == 0 and not self.timed_out and not self.interrupted

    def as_dict(self) -> Dict[str, Any]:
        """The hook as recorded in the point's ``sweep.hooks`` section."""
        return {"command": self.command, "ok": self.ok, "exit_code": self.exit_code, "timed_out": self.timed_out,
                "interrupted": self.interrupted, "wall_s": self.wall_s, "stderr_tail": self.stderr_tail,
                "logs": self.logs, "dropped_bytes": self.dropped_bytes}

    def problem(self, timeout_s: float) -> str:
        """What went wrong, for the point's error."""
        if self.interrupted:
            return f"the {self.name} hook was stopped: the sweep was interrupted"
        if self.timed_out:
            return f"the {self.name} hook ran longer than --hook-timeout-s {timeout_s:g} and was killed"
        tail = self.stderr_tail.strip().splitlines()
        return f"the {self.name} hook exited {self.exit_code}" + (f": {tail[-1]}" if tail else "")


def hook_environment(values: Mapping[str, Any], index: int, repeat: int, key: str, point_dir: str,
                     environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The hook's environment: this process's, plus ``LOADGEN_POINT_<NAME>`` for each
    swept option (``LOADGEN_POINT_CONCURRENCY=4``, ``LOADGEN_POINT_LABEL_CONFIG=a``),
    ``LOADGEN_POINT_INDEX``, ``LOADGEN_POINT_REPEAT``, ``LOADGEN_POINT_KEY`` and
    ``LOADGEN_POINT_DIR`` (the point's folder, absolute)."""
    env = dict(os.environ if environ is None else environ)
    env.update({env_name(n): value_env(v) for n, v in values.items()})
    env.update(LOADGEN_POINT_INDEX=str(index), LOADGEN_POINT_REPEAT=str(repeat), LOADGEN_POINT_KEY=key,
               LOADGEN_POINT_DIR=os.path.abspath(point_dir))
    return env


def _stop_group(proc: "subprocess.Popen[bytes]") -> None:
    """SIGTERM to the hook's process group (the shell and what it started), SIGKILL
    after a grace period."""
    for sig, wait_s in ((signal.SIGTERM, _TERM_GRACE_S), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


class _Capture:
    """Reads a hook's stream on a thread of its own, keeping its first and last ``keep``
    bytes and counting the rest."""

    def __init__(self, pipe: IO[bytes], keep: int) -> None:
        self.keep = keep
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self._stopped = False
        self._lock = threading.Lock()
        self._pipe = pipe
        self._thread = threading.Thread(target=self._read, name="loadgen-hook-output", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        fd = self._pipe.fileno()
        try:
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    return
                with self._lock:
                    if self._stopped:
                        return
                    self.total += len(chunk)
                    room = self.keep - len(self.head)
                    if room > 0:
                        self.head += chunk[:room]
                        chunk = chunk[room:]
                    if chunk:
                        self.tail += chunk
                        del self.tail[:max(0, len(self.tail) - self.keep)]
        except OSError:
            return

    def finish(self, deadline: float) -> None:
        """Waits until ``deadline`` (time.monotonic()) at most for the end of the stream,
        then keeps what came until then. A reader still blocked (a process outside the
        hook's group holds the pipe) is left to its daemon thread, the pipe to it."""
        self._thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            self._stopped = True
        if not self._thread.is_alive():
            self._pipe.close()

    @property
    def dropped(self) -> int:
        return self.total - len(self.head) - len(self.tail)

    def log(self) -> bytes:
        """What the log file holds: the output kept, with a line where bytes were dropped."""
        if not self.dropped:
            return bytes(self.head + self.tail)
        note = (f"\n[loadgen: {self.dropped} bytes of this output were dropped here; the first and last "
                f"{self.keep} bytes are kept]\n").encode()
        return bytes(self.head) + note + bytes(self.tail)

    def last(self, n: int) -> bytes:
        """The last ``n`` bytes of the stream (of what was read)."""
        kept = self.tail if self.dropped else self.head + self.tail
        return bytes(kept[-n:])


def run_hook(name: str, command: str, env: Mapping[str, str], timeout_s: float, log_dir: str,
             stop_requested: Callable[[], bool]) -> HookResult:
    """Runs ``command`` with ``shell=True`` in a process group of its own; its stdout and
    stderr go to ``<log_dir>/<name>.stdout`` and ``.stderr`` (none when empty), each cut
    to its first and last :data:`HOOK_OUTPUT_KEEP_BYTES` (the bytes dropped are counted in
    the result's ``dropped_bytes`` and noted in the file). Longer than ``timeout_s``, or
    when ``stop_requested()``, the group is terminated."""
    os.makedirs(log_dir, exist_ok=True)
    paths = {stream: os.path.join(log_dir, f"{name}.{stream}") for stream in ("stdout", "stderr")}
    started = time.monotonic()
    timed_out = interrupted = False
    proc = subprocess.Popen(command, shell=True, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None and proc.stderr is not None
    captures = {"stdout": _Capture(proc.stdout, HOOK_OUTPUT_KEEP_BYTES),
                "stderr": _Capture(proc.stderr, HOOK_OUTPUT_KEEP_BYTES)}
    try:
        while True:
            try:
                proc.wait(0.1)
                break
            except subprocess.TimeoutExpired:
                pass
            if stop_requested():
                interrupted = True
            elif time.monotonic() - started > timeout_s:
                timed_out = True
            else:
                continue
            _stop_group(proc)
            break
    except BaseException:  # a second Ctrl-C: the hook does not outlive the sweep
        _stop_group(proc)
        raise
    finally:
        drained = time.monotonic() + _DRAIN_S
        for capture in captures.values():
            capture.finish(drained)
    wall_s = time.monotonic() - started
    logs = {}
    for stream, path in paths.items():
        if captures[stream].total:
            with open(path, "wb") as f:
                f.write(captures[stream].log())
            logs[stream] = os.path.basename(path)
        elif os.path.exists(path):  # an earlier attempt's
            os.unlink(path)
    stderr_tail = captures["stderr"].last(STDERR_TAIL_BYTES).decode("utf-8", "replace")
    dropped = {stream: c.dropped for stream, c in captures.items() if c.dropped}
    exit_code = None if timed_out or interrupted else proc.returncode
    return HookResult(name, command, exit_code, timed_out, interrupted, wall_s, stderr_tail, logs, dropped)
