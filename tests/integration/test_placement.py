"""loadgen.placement (topology from sysfs, /proc and cgroups; the --pin auto plan; pinning)
and loadgen.telemetry.host (per-role CPU, RSS, machine busy/steal), on fixture trees and
on this machine's real files.

The tests that start processes; the in-process ones are in tests/unit/test_placement.py."""

from __future__ import annotations

from loadgen import placement


def _run_doc(tmp_path, *args):
    from tests.helpers import run_json

    return run_json(*args, cwd=tmp_path, timeout=120)[1]


def test_pin_auto_applies_the_plan_and_records_it_with_the_host_figures(tmp_path):
    (tmp_path / "sut_mod.py").write_text("def sut(sample):\n    return None\n")
    doc = _run_doc(tmp_path, "--sut", "python:sut_mod:sut", "--scenario", "constant", "--target-qps", "300",
                   "--duration-s", "1", "--interval-s", "0.5", "--pin", "auto",
                   "--max-issue-delay-ms", "100000")  # a shared machine may hold up pinned threads
    plan = placement.make_plan(placement.read_topology(gpus=[]))
    pl = doc["placement"]
    assert pl["pin"] == "auto" and pl["plan"]["ok"] == plan.ok
    if plan.ok:
        assert pl["applied"] == {"issue_thread": plan.issue_cpus, "dispatcher": plan.dispatcher_cpus,
                                 "sut": plan.sut_cpus}
        assert doc["settings"]["engine"]["pin_cpus"] == plan.issue_cpus
    host = doc["host"]
    assert len(host["intervals"]) >= 2 and host["cpu_s"]["issue"] > 0 and "dispatcher" in host["cpu_s"]
    assert not host["event_loop_judged"] and host["saturated"] == []
    assert doc["valid"], doc["invalid_reasons"]


def test_a_saturated_event_loop_makes_the_run_invalid(tmp_path):
    # An async SUT that blocks its event loop for 6 ms a query at 400 queries/s: the loop
    # is busy all the time; the latencies describe the client.
    (tmp_path / "busy_mod.py").write_text(
        "import time\n"
        "async def sut(sample):\n"
        "    end = time.perf_counter() + 0.006\n"
        "    while time.perf_counter() < end:\n"
        "        pass\n")
    doc = _run_doc(tmp_path, "--sut", "python:busy_mod:sut", "--scenario", "constant", "--target-qps", "400",
                   "--duration-s", "2", "--interval-s", "0.5", "--max-issue-delay-ms", "100000")
    assert doc["host"]["event_loop_judged"] and doc["host"]["saturated"]
    assert not doc["valid"]
    assert any(r.startswith("generator saturated") for r in doc["invalid_reasons"])
