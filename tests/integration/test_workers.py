"""The worker contract of a scaled-out run (``loadgen.workers``, ``Scenario.for_worker``,
``--start-at`` in the runner): each worker's seeds, its share of the load, the wait for
the common start, and the ``"worker"`` section of its result.

The tests that start processes; the in-process ones are in tests/unit/test_workers.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest


def cli(*args, env=None, **kw):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LOADGEN_")}
    environ.pop("JOB_COMPLETION_INDEX", None)
    environ.update(env or {})
    return subprocess.Popen([sys.executable, "-m", "loadgen", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=environ, **kw)


@pytest.mark.integration
def test_cli_worker_from_the_environment_with_a_past_start_at_warns_and_is_invalid():
    proc = cli("run", "--scenario", "poisson", "--sut", "null", "--target-qps", "300", "--duration-s", "0.2",
               "--start-at", f"{time.time() - 5:.3f}",
               env={"LOADGEN_WORKERS": "3", "JOB_COMPLETION_INDEX": "2"})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert "warning: --start-at" in err and "s ago, more than --start-tolerance-s 1" in err
    assert "warning: this worker started 5." in err
    assert "worker       2 of 3" in out and "worker 2 of 3 started 5." in out


@pytest.mark.integration
def test_cli_sigterm_during_the_start_wait_exits_130():
    proc = cli("run", "--scenario", "poisson", "--sut", "null", "--duration-s", "0.2",
               "--start-at", f"{time.time() + 120:.3f}")
    try:
        time.sleep(1.5)  # imported, prepared, waiting
        t = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert time.monotonic() - t < 5 and "interrupted" in err
    assert out.startswith("waiting 11") and "s for --start-at" in out  # said before the wait; nothing ran


@pytest.mark.integration
def test_cli_unsharable_scenario_is_a_usage_error():
    proc = cli("run", "--scenario", "offline", "--sut", "null", "--workers", "2")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "the offline scenario cannot be shared by --workers 2" in err and "Traceback" not in err
    proc = cli("run", "--scenario", "concurrency", "--sut", "null", "--workers", "4", "--concurrency", "3")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "--concurrency 3 cannot be shared by --workers 4" in err
