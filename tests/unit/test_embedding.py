"""loadgen embedded in a program: ``loadgen.run`` returns a :class:`loadgen.result.Result`
with the command's verdict and summary, from any thread, without changing the process;
and a real inference server (examples/embedded_server) that benchmarks its own model
behind an endpoint.

The tests that start processes or servers are in tests/integration/test_embedding.py."""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import threading

import pytest

import loadgen
from loadgen.results import load_result

POISSON = {"scenario": "poisson", "target_qps": 200, "duration_s": 1}


def model(sample_index):
    """A Python SUT: a little arithmetic per query."""
    return sum(range(sample_index % 50))


# ------------------------------------------------------------------- Result


def test_thresholds_and_a_python_sut_name():
    result = loadgen.run(sut=model, sut_name="my model", fail_if=["p99>0ms"], **POISSON)
    assert result.to_dict()["sut"] == "my model"
    [threshold] = result.to_dict()["thresholds"]
    assert threshold["expr"] == "p99>0ms" and threshold["passed"] is False
    assert not result.passed
    assert "FAIL --fail-if p99>0ms" in result.summary()
    verdict = result.verdict()
    assert json.loads(json.dumps(verdict)) == verdict
    assert verdict["counts"]["issued"] == result.counts["issued"] and verdict["passed"] is False


@pytest.mark.parametrize("options, says", [
    ({"target_qps": -1}, "--target-qps"),
    ({"target_qpz": 5}, "target_qpz"),
    ({"concurrency": 4}, "--concurrency does not apply to the poisson scenario"),
    ({"fail_if": ["p99>>1"]}, "--fail-if"),
    ({"output": "out"}, "Result.save"),
])
def test_bad_options_raise_value_error_naming_them(options, says):
    with pytest.raises(ValueError, match=says.replace("-", r"\-").replace(">", ".")):
        loadgen.run(sut=model, **{**POISSON, **options})


def test_engine_settings_and_options_do_not_mix():
    with pytest.raises(ValueError, match="scenario"):
        loadgen.run(loadgen.EngineSettings(mode="poisson", target_qps=10, duration_s=0.1), model, scenario="poisson")


def test_to_frame_and_save(tmp_path, monkeypatch):
    result = loadgen.run(sut=model, **POISSON)
    frame = result.to_frame()
    assert len(frame) == 1
    assert frame.loc[0, "counts.issued"] == result.counts["issued"] and frame.loc[0, "valid"] == result.valid
    intervals = result.to_frame(timeseries=True)
    assert len(intervals) == len(result.to_dict()["timeseries"]) > 0
    paths = result.save(str(tmp_path / "out"))
    assert load_result(str(tmp_path / "out" / "result.json"))["counts"] == result.to_dict()["counts"]
    assert (tmp_path / "out" / "summary.txt").read_text() == result.summary() and len(paths) == 4
    monkeypatch.setitem(sys.modules, "pandas", None)  # as if pandas were not installed
    with pytest.raises(ImportError, match="pip install pandas"):
        result.to_frame()


# ----------------------------------------------------- threads and side effects

def _process_state():
    return {"sigint": signal.getsignal(signal.SIGINT), "sigterm": signal.getsignal(signal.SIGTERM),
            "switch": sys.getswitchinterval(), "gc_enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}


def _run_in_thread(**kwargs):
    """loadgen.run on a thread of its own (as a web server's handler would); what it
    returned, the process's state seen by the SUT during the run, the thread's CPU
    affinity before and after."""
    out = {}

    def sut(sample_index):
        out.setdefault("during", _process_state())
        return model(sample_index)

    def body():
        out["affinity_before"] = os.sched_getaffinity(0)
        try:
            out["result"] = loadgen.run(sut=sut, **kwargs)
        except BaseException as e:  # handed to the test
            out["error"] = e
        out["affinity_after"] = os.sched_getaffinity(0)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(120)
    assert not thread.is_alive()
    if "error" in out:
        raise out["error"]
    return out


def test_freeze_gc_is_the_commands_behaviour_when_asked():
    before = gc.get_freeze_count()
    out = _run_in_thread(freeze_gc=True, **POISSON)
    assert out["during"]["frozen"] > before  # the check above would see a freeze
    assert gc.get_freeze_count() == before  # and it is undone


# ----------------------------------------------------------- the example server


