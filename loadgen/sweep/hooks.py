"""Per-point hooks: the ``--before-point`` and ``--after-point`` shell commands, run with
the point's values in the environment, bounded in time, and stopped with the sweep."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional

from loadgen.sweep.grid import env_name, value_env

__all__ = ["HookResult", "hook_environment", "run_hook"]

#: How much of a hook's stderr a failed point records.
STDERR_TAIL_BYTES = 2000
# How long a stopped hook's process group gets between SIGTERM and SIGKILL.
_TERM_GRACE_S = 2.0


@dataclass(frozen=True)
class HookResult:
    """How a hook ended: its exit code (None when it was killed for running too long
    or for the sweep's interruption), whether it timed out or was interrupted, how long
    it ran, the tail of its stderr, and the files its output went to."""

    name: str
    command: str
    exit_code: Optional[int]
    timed_out: bool
    interrupted: bool
    wall_s: float
    stderr_tail: str
    logs: Dict[str, str]

    @property
    def ok(self) -> bool:
        """It exited 0 in time."""
        return self.exit_code == 0 and not self.timed_out and not self.interrupted

    def as_dict(self) -> Dict[str, Any]:
        """The hook as recorded in the point's ``sweep.hooks`` section."""
        return {"command": self.command, "ok": self.ok, "exit_code": self.exit_code, "timed_out": self.timed_out,
                "interrupted": self.interrupted, "wall_s": self.wall_s, "stderr_tail": self.stderr_tail,
                "logs": self.logs}

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


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - STDERR_TAIL_BYTES))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def run_hook(name: str, command: str, env: Mapping[str, str], timeout_s: float, log_dir: str,
             stop_requested: Callable[[], bool]) -> HookResult:
    """Runs ``command`` with ``shell=True`` in a process group of its own; its stdout and
    stderr go to ``<log_dir>/<name>.stdout`` and ``.stderr`` (removed when empty).
    Longer than ``timeout_s``, or when ``stop_requested()``, the group is terminated."""
    os.makedirs(log_dir, exist_ok=True)
    paths = {stream: os.path.join(log_dir, f"{name}.{stream}") for stream in ("stdout", "stderr")}
    started = time.monotonic()
    timed_out = interrupted = False
    with open(paths["stdout"], "wb") as out, open(paths["stderr"], "wb") as err:
        proc = subprocess.Popen(command, shell=True, env=dict(env), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=err, start_new_session=True)
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
    wall_s = time.monotonic() - started
    logs = {}
    for stream, path in paths.items():
        if os.path.getsize(path):
            logs[stream] = os.path.basename(path)
        else:
            os.unlink(path)
    stderr_tail = _tail(paths["stderr"]) if "stderr" in logs else ""
    exit_code = None if timed_out or interrupted else proc.returncode
    return HookResult(name, command, exit_code, timed_out, interrupted, wall_s, stderr_tail, logs)
