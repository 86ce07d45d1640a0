"""A real Prometheus server for the live-metrics test (tests/integration/test_live_metrics.py):
Debian's ``prometheus`` package, unpacked by tests/servers/install_prometheus.sh into
``<repo>/.servers/prometheus`` (not installed on the system).

:func:`running_prometheus` starts it on 127.0.0.1 with a configuration that scrapes the
given targets every second, and stops it (by its PID) afterwards.
"""

from __future__ import annotations

import json
import os
import time
import urllib.parse
from typing import Any, Dict, Iterator, List, Optional, Sequence

from tests.servers.procs import ServerProcess, free_port, http_get, install_server, require_servers

__all__ = ["INSTALL_HINT", "Prometheus", "find_prometheus", "running_prometheus"]

#: A prometheus binary to use instead of the unpacked package.
BINARY_ENV = "LOADGEN_TEST_PROMETHEUS"
INSTALL_HINT = ("bash tests/servers/install_prometheus.sh .servers/prometheus (Debian's prometheus package, "
                f"unpacked; needs apt-get), or set {BINARY_ENV} to a prometheus binary")


def find_prometheus() -> Optional[str]:
    """The prometheus binary: $LOADGEN_TEST_PROMETHEUS, else the unpacked package's,
    installed on first use; None when that failed."""
    given = os.environ.get(BINARY_ENV)
    if given:
        return given
    dest = install_server("prometheus", timeout_s=300.0)
    if dest is None:
        return None
    binary = os.path.join(dest, "usr", "bin", "prometheus")
    return binary if os.access(binary, os.X_OK) else None


class Prometheus:
    """A running Prometheus: its process and its HTTP API."""

    def __init__(self, process: ServerProcess, url: str) -> None:
        self.process = process
        self.url = url

    def query(self, expr: str) -> List[Any]:
        """The instant query's result vector (``data.result``)."""
        status, body = http_get(f"{self.url}/api/v1/query?query={urllib.parse.quote(expr)}", 5.0)
        assert status == 200, body
        answer = json.loads(body)
        assert answer["status"] == "success", answer
        return list(answer["data"]["result"])

    def targets(self) -> Dict[str, str]:
        """The active targets' scrape URLs and health ("unknown" before their first scrape)."""
        status, body = http_get(f"{self.url}/api/v1/targets", 5.0)
        assert status == 200, body
        return {t["scrapeUrl"]: t["health"] for t in json.loads(body)["data"]["activeTargets"]}


def running_prometheus(workdir: str, targets: Sequence[str], timeout_s: float = 30.0) -> Iterator[Prometheus]:
    """A pytest fixture's body: Prometheus scraping ``targets`` (host:port) every second,
    its data in ``workdir``; stopped afterwards. The test is skipped when Prometheus cannot
    be installed (failed instead when servers are required, as in CI)."""
    import pytest

    binary = find_prometheus()
    if binary is None:
        if require_servers():
            pytest.fail(f"Prometheus is not installed: {INSTALL_HINT}")
        pytest.skip(f"Prometheus is not installed: {INSTALL_HINT}")
    config = os.path.join(workdir, "prometheus.yml")
    with open(config, "w", encoding="utf-8") as f:
        f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                "scrape_configs:\n  - job_name: loadgen\n    static_configs:\n"
                f"      - targets: [{', '.join(json.dumps(t) for t in targets)}]\n")
    port = free_port()
    process = ServerProcess([binary, f"--config.file={config}", f"--storage.tsdb.path={os.path.join(workdir, 'tsdb')}",
                             f"--web.listen-address=127.0.0.1:{port}"], os.path.join(workdir, "prometheus.log"),
                            cwd=workdir)
    try:
        url = f"http://127.0.0.1:{port}"
        process.wait_http_ok(f"{url}/-/ready", timeout_s)
        server = Prometheus(process, url)
        # Discovery hands targets to the scrapers up to 5 s after the start: scrapes
        # begin within a second of their listing.
        if len(wait_until(server.targets, timeout_s)) < len(targets):
            raise RuntimeError(f"Prometheus did not list the targets {list(targets)} within {timeout_s:g} s; "
                               f"log tail:\n{process.log_tail()}")
        yield server
    finally:
        process.stop(grace_s=5.0)


def wait_until(check: Any, timeout_s: float, step_s: float = 0.1) -> Any:
    """``check()`` once it is truthy, or its last value after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    value = check()
    while not value and time.monotonic() < deadline:
        time.sleep(step_s)
        value = check()
    return value
