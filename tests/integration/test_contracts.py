"""Rules docs/DESIGN.md states about how loadgen's modules depend on one another, checked
on the source so that breaking one fails here: no module uses another's private names;
the engine does not import the network package; the native threads' roles come from the
core's own table of the names they take; loadgen's Python threads have distinct names.

The tests that start processes; the in-process ones are in tests/unit/test_contracts.py."""

from __future__ import annotations

import json

from tests.helpers import run_cli
from tests.servers.scripted_proc import start_scripted


def test_a_native_http_run_reports_its_io_threads_cpu_as_io(tmp_path):
    with start_scripted(tmp_path) as srv:
        proc = run_cli("run", "--sut", f"{srv.url}/v2/models/m/infer", "--http-engine", "native",
                       "--io-threads", "2", "--scenario", "concurrency", "--concurrency", "16",
                       "--query-count", "20000", "--json", "--quiet", "--interval-s", "0.5",
                       "--max-issue-delay-ms", "1000", timeout=120)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["counts"]["completed"] == 20000
    cpu_s = doc["host"]["cpu_s"]
    # 20,000 responses read and parsed take the I/O threads well over one clock tick.
    assert cpu_s.get("io", 0) > 0, cpu_s
