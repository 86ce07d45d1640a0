"""GPU and host telemetry inside a run (loadgen.telemetry.run): the result's gpu section,
energy per phase and per query, per-interval GPU figures in the time series, the summary
lines, --gpus checks, and the real NVML path on a machine without a GPU driver."""

from __future__ import annotations

import functools

import pytest

import loadgen.telemetry.run as telemetry_run
from loadgen.options import resolve
from loadgen.results import render_summary
from loadgen.runner import prepare, run_benchmark
from loadgen.telemetry.gpu import GpuSampler
from loadgen.telemetry.gpu_fake import FakeBackend, FakeDevice, FakeMigDevice

POWER_W = (300.0, 120.0)


def _fake_devices():
    return [
        FakeDevice(uuid="GPU-aaaa0000-0000-0000-0000-000000000000", name="Fake H200", power_w=POWER_W[0],
                   utilization_pct=(90.0, 95.0), memory_used=(40 << 30,)),
        FakeDevice(uuid="GPU-bbbb0000-0000-0000-0000-000000000000", name="Fake A100 MIG", power_w=POWER_W[1],
                   mig_devices=[FakeMigDevice(uuid="MIG-cccc0000-0000-0000-0000-000000000000",
                                              memory_used=(3 << 30,))]),
    ]


@pytest.fixture
def fake_gpus(monkeypatch):
    """Every GpuSampler the run makes reads two scripted GPUs (one with a MIG device)."""
    devices = _fake_devices()
    monkeypatch.setattr(telemetry_run, "GpuSampler",
                        functools.partial(GpuSampler, backend=FakeBackend(devices)))
    return devices


def _run(*flags):
    # What these runs check is the telemetry; the issue-delay bound is relaxed so that a
    # busy shared two-core machine does not judge them invalid (a run queue of ten
    # threads on its two cores made a p99 issue delay of 257 ms).
    options, given = resolve({"max_issue_delay_ms": 1000.0, **dict(flags)})
    return run_benchmark(options, given=given)


def test_a_run_reports_gpu_figures_energy_per_phase_and_per_query(fake_gpus):
    doc = _run(("sut", "demo"), ("scenario", "constant"), ("target_qps", "400"), ("duration_s", "1.0"),
               ("interval_s", "0.25"), ("warmup_s", "0.3"))
    gpu = doc["gpu"]
    assert gpu["status"] == "ok", gpu["reason"]
    by_uuid = {d["uuid"]: d for d in gpu["devices"]}
    h200 = by_uuid[fake_gpus[0].uuid]
    assert h200["name"] == "Fake H200" and h200["utilization_pct"]["max"] <= 95.0
    assert 89.0 <= h200["utilization_pct"]["mean"] <= 95.0
    assert h200["memory_used_bytes"]["max"] == 40 << 30
    # Energy is read at the end of the warm-up, at the end of issuing and at the end:
    # the scripted counter grows at exactly POWER_W, so energy = power x measured time.
    measured_s = doc["duration_s"]
    assert h200["energy_j"]["total"] == pytest.approx(POWER_W[0] * measured_s, rel=0.15)
    total = gpu["energy_j_total"]
    assert total == pytest.approx(sum(POWER_W) * measured_s, rel=0.15)
    completed = doc["counts"]["completed"]
    assert gpu["energy_per_query_j"] == pytest.approx(total / completed)
    assert gpu["queries_per_joule"] == pytest.approx(completed / total)
    # A MIG device: its memory, and utilization said to be unsupported, never zeros.
    mig = by_uuid["MIG-cccc0000-0000-0000-0000-000000000000"]
    assert mig["memory_used_bytes"]["max"] == 3 << 30
    assert mig["utilization_pct"].get("supported") is False
    # The time series carries each interval's GPU figures, by UUID.
    series = [p for p in doc["timeseries"] if p.get("gpu")]
    assert len(series) >= 3
    assert series[1]["gpu"][fake_gpus[0].uuid]["power_w"] == pytest.approx(POWER_W[0], rel=0.05)
    text = render_summary(doc)
    assert "Fake H200" in text and "mJ per query" in text and "queries per J" in text


def test_gpus_none_and_a_selection_that_names_no_device(fake_gpus):
    doc = _run(("sut", "demo"), ("duration_s", "0.3"), ("gpus", "none"))
    assert doc["gpu"]["status"] == "unavailable" and "no GPU selected" in doc["gpu"]["reason"]
    options, _ = resolve({"sut": "demo", "duration_s": "0.3", "gpus": "7"})
    with pytest.raises(ValueError, match="7"):
        prepare(options)


def test_without_a_driver_the_run_goes_on_and_says_why():
    # This machine has no NVIDIA driver: the real pynvml path answers "unavailable".
    doc = _run(("sut", "demo"), ("scenario", "constant"), ("target_qps", "500"), ("duration_s", "0.3"))
    assert doc["valid"], doc["invalid_reasons"]
    assert doc["gpu"]["status"] == "unavailable" and doc["gpu"]["reason"]
    assert "\n" not in doc["gpu"]["reason"]
    assert "gpu          none sampled:" in render_summary(doc)
    assert doc["host"]["intervals"] and doc["host"]["cpu_s"]


def test_a_gpu_lost_mid_run_stops_its_sampling_and_the_run_goes_on(monkeypatch):
    devices = _fake_devices()
    devices[1].fail_at = 3
    monkeypatch.setattr(telemetry_run, "GpuSampler", functools.partial(GpuSampler, backend=FakeBackend(devices)))
    doc = _run(("sut", "demo"), ("scenario", "constant"), ("target_qps", "500"), ("duration_s", "0.8"),
               ("interval_s", "0.2"))
    assert doc["valid"], doc["invalid_reasons"]
    gpu = doc["gpu"]
    assert gpu["status"] == "partial"
    lost = [d for d in gpu["devices"] if d.get("lost")]
    assert lost and all(d["uuid"] != devices[0].uuid for d in lost)
    assert "LOST" in render_summary(doc)
