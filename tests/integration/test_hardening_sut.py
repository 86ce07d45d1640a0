"""Python SUTs that misbehave: raising SystemExit or KeyboardInterrupt, failing with huge
messages and kinds full of control characters, and sync functions under a closed loop.

The tests that start processes; the in-process ones are in tests/unit/test_hardening_sut.py."""

from __future__ import annotations

import json
import re
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import assert_counts_add_up, run_cli, write

KIND = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# A SUT in each Python form that raises `EXC` on every third query it receives (the first
# of them is the third query) and completes the others; `EXC` and `EVERY` are set by the
# test that writes the file.
FORMS_SRC = """
import itertools

_n = itertools.count(1)


def _maybe_raise():
    if next(_n) % EVERY == 0:
        raise EXC


def f(sample):
    _maybe_raise()


async def af(sample):
    _maybe_raise()


class B:
    def issue(self, batch):
        _maybe_raise()
        batch.complete()


b = B()
"""


FORM_ATTRS = {"function": "f", "async": "af", "batched": "b"}


def forms_sut(tmp_path: Path, exc: str, every: int) -> Path:
    return write(tmp_path / "raising_sut.py", f"EXC = {exc}\nEVERY = {every}\n" + textwrap.dedent(FORMS_SRC))


@pytest.mark.integration
@pytest.mark.alone
@pytest.mark.parametrize("form", ["function", "async", "batched"])
def test_sut_raising_system_exit_fails_that_query_and_the_run_goes_on(tmp_path, form):
    sut = forms_sut(tmp_path, "SystemExit(7)", 3)
    out = tmp_path / "out"
    # batch size 1: the batched SUT's raise fails exactly one query too. 20 ms apart, so
    # that a busy host's stall seldom hands it two queries due at once.
    # No limit on lateness: what is checked is the SystemExit, not a busy host's timing.
    proc = run_cli("run", "--scenario", "constant", "--target-qps", "50", "--query-count", "30",
                   "--sut", f"python:{sut}:{FORM_ATTRS[form]}", "--max-error-rate", "1",
                   "--max-issue-delay-ms", "60000", "--max-lateness-share", "1", "--output", out, "--quiet",
                   timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "result.json").read_text())
    c = doc["counts"]
    assert_counts_add_up(c)
    assert c["issued"] == 30 and c["cancelled"] == 0
    assert doc["interrupted"] is False
    assert doc["errors"]["counts"] == {"SystemExit": c["failed"]}
    assert c["failed"] >= 5 and c["completed"] >= 15  # the run went on after the first
    assert any(m.startswith("SystemExit") for m in doc["errors"]["messages"])


@pytest.mark.integration
@pytest.mark.parametrize("concurrency", [1, 3])
def test_closed_loop_function_sut_raising_system_exit_fails_that_query_only(tmp_path, concurrency):
    sut = forms_sut(tmp_path, "SystemExit(7)", 3)
    out = tmp_path / "out"
    proc = run_cli("run", "--scenario", "concurrency", "--concurrency", concurrency, "--query-count", "30",
                   "--sut", f"python:{sut}:f", "--max-error-rate", "1", "--max-issue-delay-ms", "100",
                   "--output", out, "--quiet", timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "result.json").read_text())
    c = doc["counts"]
    assert_counts_add_up(c)
    assert c["issued"] == 30
    assert doc["errors"]["counts"] == {"SystemExit": 10}
    assert c["completed"] == 20


@pytest.mark.integration
@pytest.mark.parametrize("form", ["function", "async", "batched"])
def test_sut_raising_keyboard_interrupt_stops_the_run_as_interrupted_and_writes_the_result(tmp_path, form):
    sut = forms_sut(tmp_path, "KeyboardInterrupt()", 20)
    out = tmp_path / "out"
    started = time.monotonic()
    proc = run_cli("run", "--scenario", "constant", "--target-qps", "200", "--duration-s", "30",
                   "--sut", f"python:{sut}:{FORM_ATTRS[form]}", "--max-issue-delay-ms", "100",
                   "--output", out, "--quiet", timeout=60)
    elapsed_s = time.monotonic() - started
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr
    assert elapsed_s < 20  # stopped near the 20th query (0.1 s in), not after 30 s
    doc = json.loads((out / "result.json").read_text())
    assert doc["interrupted"] is True and doc["valid"] is False
    c = doc["counts"]
    assert_counts_add_up(c)
    assert c["completed"] >= 19  # what was measured before the interrupt is kept
    assert doc["errors"]["counts"].get("KeyboardInterrupt", 0) >= 1


@pytest.mark.integration
def test_closed_loop_sut_raising_keyboard_interrupt_writes_an_interrupted_result(tmp_path):
    sut = forms_sut(tmp_path, "KeyboardInterrupt()", 20)
    out = tmp_path / "out"
    proc = run_cli("run", "--scenario", "concurrency", "--concurrency", "2", "--duration-s", "30",
                   "--sut", f"python:{sut}:f", "--output", out, "--quiet", timeout=60)
    assert proc.returncode == 130, proc.stderr
    doc = json.loads((out / "result.json").read_text())
    assert doc["interrupted"] is True
    assert_counts_add_up(doc["counts"])
    assert doc["counts"]["completed"] >= 19


HUGE_SRC = """
MB = 1 << 20
_kinds = {}


def raising(sample):
    # One class whose name is full of control characters (Python refuses NULs there).
    raise _kinds.setdefault("k", type("Bad Kind\\n\\x01\\x7f" + "\\x01" * 200, (Exception,), {}))(
        "\\x00" * 16 + "m" * MB + "\\x00")


class Failing:
    def issue(self, batch):
        for i, qid in enumerate(batch.ids.tolist()):
            batch.fail([qid], kind="\\x00\\x00nul kind\\n" + "\\x00" * 5000, message="x\\x00y\\x1b" * (MB // 4))


failing = Failing()


class ManyKinds:
    n = 0

    def issue(self, batch):
        for qid in batch.ids.tolist():
            ManyKinds.n += 1
            batch.fail([qid], kind=f"kind{ManyKinds.n}", message=f"message {ManyKinds.n}")


many_kinds = ManyKinds()
"""


@pytest.mark.integration
@pytest.mark.parametrize("attr", ["raising", "failing"])
def test_a_thousand_megabyte_error_messages_give_a_small_clean_result(tmp_path, attr):
    sut = write(tmp_path / "huge_sut.py", HUGE_SRC)
    out = tmp_path / "out"
    # Each query makes a megabyte-long message, a millisecond or more of the issue thread's
    # time: the run is about the result, not the schedule, so the delay bounds are wide.
    proc = run_cli("run", "--scenario", "constant", "--target-qps", "2000", "--query-count", "1000",
                   "--sut", f"python:{sut}:{attr}", "--max-error-rate", "1", "--max-issue-delay-ms", "60000",
                   "--timeout-ms", "60000", "--output", out, "--quiet", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    raw = (out / "result.json").read_bytes()
    assert len(raw) < 100_000
    assert b"\x00" not in raw and b"\\u0000" not in raw
    doc = json.loads(raw)
    c = doc["counts"]
    assert_counts_add_up(c)
    assert c["failed"] == 1000
    counts = doc["errors"]["counts"]
    assert sum(counts.values()) == 1000
    assert len(counts) == 1
    (kind,) = counts
    assert KIND.match(kind), kind
    messages = doc["errors"]["messages"]
    assert 1 <= len(messages) <= 10
    for m in messages:
        assert len(m) < 700 and not CONTROL.search(m), m[:100]
        assert m.startswith(kind + ": ")
        assert "more bytes cut" in m
    summary = (out / "summary.txt").read_text()
    assert "\x00" not in summary and len(summary) < 50_000


@pytest.mark.integration
def test_many_distinct_error_kinds_are_capped_and_still_add_up(tmp_path):
    sut = write(tmp_path / "huge_sut.py", HUGE_SRC)
    out = tmp_path / "out"
    proc = run_cli("run", "--scenario", "constant", "--target-qps", "2000", "--query-count", "1000",
                   "--sut", f"python:{sut}:many_kinds", "--max-error-rate", "1",
                   "--max-issue-delay-ms", "1000", "--output", out, "--quiet", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((out / "result.json").read_text())
    counts = doc["errors"]["counts"]
    assert sum(counts.values()) == doc["counts"]["failed"] == 1000
    assert len(counts) <= 65
    assert counts["other_kinds"] == 1000 - 64
    assert counts["kind1"] == 1 and counts["kind64"] == 1
    assert len(doc["errors"]["messages"]) <= 20


@pytest.mark.integration
def test_cli_sync_function_with_concurrency_4_overlaps_and_is_not_generator_overload(tmp_path):
    sut = write(tmp_path / "sleepy.py", """
        import time


        def f(sample):
            time.sleep(0.05)
    """)
    out = tmp_path / "out"
    # --max-issue-delay-ms 100: a CPU hiccup on the noisy test machine is not what this is
    # about; one at a time, the issue delay is about 150 ms (three queries ahead of each).
    proc = run_cli("run", "--scenario", "concurrency", "--concurrency", "4", "--duration-s", "1",
                   "--sut", f"python:{sut}:f", "--max-issue-delay-ms", "100", "--output", out,
                   "--quiet", timeout=60)
    doc = json.loads((out / "result.json").read_text())
    assert proc.returncode == 0, (doc["invalid_reasons"], proc.stderr)
    assert doc["valid"] is True
    assert not any("generator overload" in r for r in doc["invalid_reasons"])
    assert doc["issue_delay_ns"]["p99"] < 20e6
    # One at a time, 1 s of 50 ms queries is at most 20; four at once make about 80.
    assert doc["counts"]["completed"] >= 50
    assert doc["latency_ns"]["p50"] < 80e6
