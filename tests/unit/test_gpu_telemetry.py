"""The GPU sampler (loadgen.telemetry): statistics, energy, MIG, lost GPUs, selection,
the thread, the real NVML path on a machine without a driver, and the GPU check's own
logic and its no-GPU exit.

Most tests drive the sampler by hand over the scripted FakeBackend with a FakeClock:
``tick()`` is what the thread does every sample_ms, so every figure is known exactly.

The tests that start processes or servers are in tests/integration/test_gpu_telemetry.py.
"""

import json
import os
import sys
import threading
import time

import pytest

from loadgen.telemetry import (
    DeviceInfo,
    FakeBackend,
    FakeClock,
    FakeDevice,
    FakeMigDevice,
    GpuNotSupported,
    GpuSampler,
    GpuSelection,
    NvmlBackend,
    parse_gpus,
    select,
)
from loadgen.telemetry.streams import BinnedSeries, CounterSeries, StreamStats

GIB = 1 << 30
UA = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
UB = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
MIG0 = "MIG-00000000-1111-2222-3333-444444444444"
MIG1 = "MIG-11111111-1111-2222-3333-444444444444"


def _sampler(devices, gpus="all", clock=None, **kw):
    clock = clock or FakeClock()
    backend = FakeBackend(devices, clock=clock)
    return GpuSampler(gpus, 100, backend=backend, clock=clock, **kw), clock, backend


def _drive(sampler, clock, ticks, *, issue_end_at=None):
    """open, mark start, `ticks` ticks 100 ms apart (issue_end after tick issue_end_at),
    mark end."""
    sampler.open()
    sampler.mark("start")
    for k in range(ticks):
        sampler.tick()
        if issue_end_at is not None and k == issue_end_at:
            sampler.mark("issue_end")
        clock.advance(0.1)
    sampler.mark("end")


# ------------------------------------------------------------------ streams

def test_stream_stats_are_exact_on_a_known_series():
    s = StreamStats()
    for v in range(1, 101):
        s.add(v)
    s.add(float("nan"))  # ignored
    assert s.summary() == {"min": 1, "mean": 50.5, "max": 100, "p50": 50.0, "p99": 99.0, "n": 100}
    assert StreamStats().summary() == {"n": 0}


def test_stream_stats_scale_large_values_within_hdr_precision():
    s = StreamStats(1000.0)  # watts recorded as mW
    for w in (250.5, 300.25, 699.999):
        s.add(w)
    out = s.summary()
    assert (out["min"], out["max"]) == (250.5, 699.999)
    assert out["mean"] == pytest.approx((250.5 + 300.25 + 699.999) / 3)
    assert out["p50"] == pytest.approx(300.25, rel=1e-3)
    assert out["p99"] == 699.999  # clamped to the exact max
    big = StreamStats()
    for b in (10 * GIB, 20 * GIB, 30 * GIB):
        big.add(b)
    assert big.summary()["p50"] == pytest.approx(20 * GIB, rel=1e-3)


def test_binned_series_halves_resolution_and_keeps_every_reading():
    s = BinnedSeries(max_points=8)
    for i in range(100):
        s.add(i * 10, float(i))
    assert len(s) <= 8
    bins = s.bins(0, 1000, 1)
    assert bins == [(100, float(sum(range(100))), 99.0)]
    assert s.readings_per_point == 16
    fine = BinnedSeries()
    for i in range(10):
        fine.add(i * 100, float(i))
    assert fine.bins(0, 500, 3) == [(5, 10.0, 4.0), (5, 35.0, 9.0), (0, 0.0, float("-inf"))]
    with pytest.raises(ValueError, match="max_points"):
        BinnedSeries(1)


def test_counter_series_interpolates_and_stays_bounded():
    c = CounterSeries(max_points=5)
    for i in range(50):
        c.add(i * 1000, i * 10.0)  # 10 per 1000 ns
    assert len(c) <= 5
    assert c.last() == (49_000, 490.0)
    assert c.at(12_345) == pytest.approx(123.45)
    assert c.delta(10_000, 20_000) == pytest.approx(100.0)
    assert c.delta(45_000, 60_000) == pytest.approx(40.0)  # only the covered part
    assert c.delta(60_000, 70_000) is None
    assert c.at(-1) is None


# ------------------------------------------------------------------- report

def _known_device(**kw):
    base = dict(
        name="Fake H200", memory_total=80 * GIB,
        memory_used=(10 * GIB, 20 * GIB, 30 * GIB, 40 * GIB),
        sm_clock_mhz=(1000, 1500, 1980, 1980), mem_clock_mhz=(1593,),
        temperature_c=(40, 50, 60, 70), power_w=400.0, power_readings_w=(300.0, 500.0),
        power_limit_w=700.0, clocks_event_reasons=(0, 0x4, 0x4 | 0x40, 0x1),
        utilization_pct=(10, 20, 30, 40))
    base.update(kw)
    return FakeDevice(UA, **base)


def test_report_every_field_on_known_series():
    sampler, clock, _ = _sampler([_known_device()])
    _drive(sampler, clock, 8, issue_end_at=5)  # ticks at 0..0.7 s, marks at 0, 0.5, 0.8 s
    rep = sampler.report(completed_queries=400, completed_samples=1600)
    assert rep["status"] == "ok" and rep["reason"] == ""
    assert rep["sample_ms"] == 100.0 and rep["selection"] == "--gpus=all"
    (d,) = rep["devices"]
    assert {k: d[k] for k in ("index", "uuid", "name", "driver_version", "mig")} == {
        "index": 0, "uuid": UA, "name": "Fake H200", "driver_version": "999.99-fake", "mig": False}
    assert d["samples"] == 8
    gib = GIB
    assert d["memory_used_bytes"]["min"] == 10 * gib and d["memory_used_bytes"]["max"] == 40 * gib
    assert d["memory_used_bytes"]["mean"] == 25 * gib
    assert d["memory_used_bytes"]["p50"] == pytest.approx(20 * gib, rel=1e-3)
    assert d["memory_total_bytes"] == 80 * gib
    assert d["sm_clock_mhz"] == {"min": 1000, "mean": 1615.0, "max": 1980, "p50": 1500.0, "p99": 1980.0, "n": 8}
    assert d["mem_clock_mhz"] == {"min": 1593, "mean": 1593.0, "max": 1593, "p50": 1593.0, "p99": 1593.0, "n": 8}
    assert d["temperature_c"] == {"min": 40, "mean": 55.0, "max": 70, "p50": 50.0, "p99": 70.0, "n": 8}
    # The driver's buffer: one utilization and one power sample per 100 ms since init,
    # drained by stop() at 0.8 s: samples at 0.1 .. 0.8 s.
    assert d["utilization_pct"] == {"min": 10, "mean": 25.0, "max": 40, "p50": 20.0, "p99": 40.0, "n": 8}
    assert d["power_source"] == "driver samples"
    # watts are recorded as mW: percentiles above 2048 are within HDR's 0.1%
    assert d["power_w"] == {"min": 300.0, "mean": 400.0, "max": 500.0, "p50": pytest.approx(300.0, rel=1e-3),
                            "p99": 500.0, "n": 8}
    assert d["power_limit_w"] == 700.0
    # 400 W on the energy counter: 0.5 s to issue_end, 0.3 s to the end.
    assert d["energy_j"] == pytest.approx({"start_to_issue_end": 200.0, "issue_end_to_end": 120.0, "total": 320.0})
    assert d["energy_source"] == "counter"
    assert d["throttle_reasons"] == ["gpu_idle", "sw_power_cap", "hw_thermal_slowdown"]
    assert d["throttle_samples"] == {"gpu_idle": 2, "sw_power_cap": 4, "hw_thermal_slowdown": 2}
    assert "lost" not in d
    assert rep["energy_j_total"] == pytest.approx(320.0)
    assert rep["energy_per_query_j"] == pytest.approx(0.8)
    assert rep["energy_per_sample_j"] == pytest.approx(0.2)
    assert rep["queries_per_joule"] == pytest.approx(1.25)
    assert rep["sampler"] == {"thread_cpu_s": None, "wall_s": None, "cpu_pct_of_core": None}  # no thread
    json.dumps(rep, allow_nan=False)  # a plain JSON document


def test_power_falls_back_to_instant_then_averaged_readings_and_energy_to_the_integral():
    dev = _known_device(samples_supported=False, energy_supported=False)
    sampler, clock, _ = _sampler([dev])
    _drive(sampler, clock, 4)
    d = sampler.report()["devices"][0]
    assert d["power_source"] == "instant"
    assert d["power_w"]["n"] == 4 and d["power_w"]["mean"] == 400.0
    assert d["utilization_pct"] == {"supported": False, "why": "samples(utilization): not supported"}
    # No counter: the integral of the power readings, from a reading at the start mark:
    # 300 W (start, t = 0), then ticks 500, 300, 500, 300 W at 0.0 .. 0.3 s, held to
    # the end mark at 0.4 s: 0 + 40 + 40 + 40 + 30 J.
    assert d["energy_source"] == "power integral"
    assert d["energy_j"]["total"] == pytest.approx(150.0)
    dev = _known_device(power_instant_supported=False, samples_supported=False)
    sampler, clock, _ = _sampler([dev])
    _drive(sampler, clock, 4)
    d = sampler.report()["devices"][0]
    assert d["power_source"] == "average" and d["power_w"]["min"] == 300.0 and d["power_w"]["n"] == 4


def test_report_without_marks_or_counts_has_no_per_query_energy():
    sampler, clock, _ = _sampler([_known_device()])
    sampler.open()
    sampler.tick()
    rep = sampler.report(completed_queries=0)
    assert rep["devices"][0]["energy_j"] == {"start_to_issue_end": None, "issue_end_to_end": None, "total": None}
    assert rep["energy_j_total"] is None and rep["energy_per_query_j"] is None and rep["queries_per_joule"] is None


def test_stop_marks_end_when_only_start_was_marked():
    sampler, clock, _ = _sampler([_known_device()])
    sampler.open()
    sampler.mark("start")
    clock.advance(1.0)
    rep = sampler.report(completed_queries=10)
    assert rep["devices"][0]["energy_j"]["total"] == pytest.approx(400.0)
    with pytest.raises(ValueError, match="'begin' is not one of start, issue_end, end"):
        sampler.mark("begin")


def test_intervals_align_with_the_run_time_series():
    sampler, clock, _ = _sampler([_known_device(samples_supported=False)])
    start = clock.now_ns
    _drive(sampler, clock, 10)  # ticks at 0.0 .. 0.9 s
    iv = sampler.intervals(measure_start_ns=start, interval_ns=500_000_000, n_intervals=3)
    assert len(iv) == 3
    first = iv[0][UA]
    assert first["power_w"] == pytest.approx(380.0)  # 300, 500, 300, 500, 300
    assert first["memory_used_bytes"] == 40 * GIB
    assert first["energy_j"] == pytest.approx(200.0)  # 400 W x 0.5 s
    assert first["utilization_pct"] is None  # the driver's buffer is not supported here
    assert iv[1][UA]["energy_j"] == pytest.approx(200.0)
    assert iv[2][UA] == {"utilization_pct": None, "power_w": None, "memory_used_bytes": None, "energy_j": None}
    with pytest.raises(ValueError, match="interval_ns"):
        sampler.intervals(measure_start_ns=start, interval_ns=0, n_intervals=3)
    rep = sampler.report(measure_start_ns=start, interval_ns=500_000_000, n_intervals=2)
    assert rep["intervals"][0][UA]["utilization_pct"] is None and len(rep["intervals"]) == 2


def test_interval_utilization_comes_from_the_drained_driver_samples():
    sampler, clock, _ = _sampler([_known_device()])
    start = clock.now_ns
    _drive(sampler, clock, 10)
    iv = sampler.intervals(measure_start_ns=start, interval_ns=400_000_000, n_intervals=2)
    # driver samples at 0.1, 0.2, 0.3 s (10, 20, 30) and 0.4 .. 0.7 s (40, 10, 20, 30)
    assert iv[0][UA]["utilization_pct"] == pytest.approx(20.0)
    assert iv[1][UA]["utilization_pct"] == pytest.approx(25.0)


def test_memory_stays_bounded_over_a_long_run():
    sampler, clock, _ = _sampler([_known_device()], max_points=64)
    _drive(sampler, clock, 2000)
    d = sampler.report()["devices"][0]
    assert d["samples"] == 2000 and d["memory_used_bytes"]["n"] == 2000
    assert d["memory_used_bytes"]["mean"] == 25 * GIB  # statistics stay exact
    gpu = sampler._gpus[0]
    assert len(gpu.units[0].memory_series) <= 64 and len(gpu.energy) <= 64 and len(gpu.utilization_series) <= 64


# ---------------------------------------------------------------------- MIG

def _mig_gpu():
    return FakeDevice(UB, name="Fake A100", power_w=200.0, utilization_pct=(99,), mig_devices=[
        FakeMigDevice(MIG0, memory_total=10 * GIB, memory_used=(1 * GIB, 3 * GIB)),
        FakeMigDevice(MIG1, memory_total=20 * GIB, memory_used=(5 * GIB,)),
    ])


def test_mig_devices_report_memory_and_say_utilization_is_not_supported():
    sampler, clock, _ = _sampler([_known_device(), _mig_gpu()])
    _drive(sampler, clock, 4)
    rep = sampler.report(completed_queries=100)
    assert [d["uuid"] for d in rep["devices"]] == [UA, MIG0, MIG1]
    m0, m1 = rep["devices"][1:]
    for m, slot in ((m0, 0), (m1, 1)):
        assert m["mig"] is True and m["parent_uuid"] == UB and m["mig_index"] == slot and m["index"] == 1
        assert m["utilization_pct"] == {"supported": False, "why": "MIG device"}  # not zeros
        assert m["energy_j"]["total"] == pytest.approx(80.0)  # the whole GPU's: 200 W x 0.4 s
    assert m0["memory_used_bytes"]["mean"] == 2 * GIB and m0["memory_total_bytes"] == 10 * GIB
    assert m1["memory_used_bytes"]["max"] == 5 * GIB and m1["memory_total_bytes"] == 20 * GIB
    # each physical GPU counts once: 400 W x 0.4 s + 200 W x 0.4 s
    assert rep["energy_j_total"] == pytest.approx(240.0)
    iv = sampler.intervals(measure_start_ns=1_000_000_000, interval_ns=400_000_000, n_intervals=1)
    assert iv[0][MIG0]["utilization_pct"] is None and iv[0][MIG0]["memory_used_bytes"] == 3 * GIB


def test_a_mig_uuid_selects_one_mig_device():
    sampler, clock, _ = _sampler([_known_device(), _mig_gpu()], gpus=MIG1)
    _drive(sampler, clock, 2)
    assert [d["uuid"] for d in sampler.report()["devices"]] == [MIG1]


# ----------------------------------------------------------- errors mid-run

@pytest.mark.parametrize("kind,reason", [("lost", "GPU is lost"), ("error", "Unknown Error")])
def test_one_gpu_lost_mid_run_the_other_goes_on(kind, reason):
    lost = FakeDevice(UB, fail_at=3, fail_error=kind, power_w=100.0)
    sampler, clock, _ = _sampler([_known_device(), lost])
    _drive(sampler, clock, 10)
    rep = sampler.report(completed_queries=100)
    assert rep["status"] == "partial"
    assert f"{UB} lost at +0.3 s" in rep["reason"] and reason in rep["reason"]
    assert "energy totals cover 1 of 2 GPUs" in rep["reason"]
    good, bad = rep["devices"]
    assert good["samples"] == 10 and "lost" not in good and good["energy_j"]["total"] == pytest.approx(400.0)
    assert bad["samples"] == 3
    assert bad["lost"]["at_ns"] == 1_300_000_000 and reason in bad["lost"]["reason"]
    assert bad["energy_j"]["total"] is None
    assert bad["energy_j"]["until_lost"] == pytest.approx(20.0)  # 100 W up to its last reading at 0.2 s
    assert rep["energy_j_total"] == pytest.approx(400.0)


def test_a_lost_mig_device_does_not_stop_its_siblings():
    gpu = _mig_gpu()
    sampler, clock, backend = _sampler([gpu])
    sampler.open()
    sampler.tick()

    def broken(handle, real=backend.memory):
        if handle.mig == 0:
            from loadgen.telemetry import GpuLost
            raise GpuLost("memory: GPU is lost")
        return real(handle)

    backend.memory = broken
    clock.advance(0.1)
    sampler.tick()
    rep = sampler.report()
    m0, m1 = rep["devices"]
    assert m0["lost"]["reason"] == "memory: GPU is lost" and m0["samples"] == 1
    assert "lost" not in m1 and m1["samples"] == 2 and rep["status"] == "partial"


def test_a_broken_backend_never_raises_into_the_run():
    class Broken(FakeBackend):
        def clocks(self, handle):
            raise RuntimeError("bug in a backend")

    clock = FakeClock()
    sampler = GpuSampler("all", 100, backend=Broken([_known_device()], clock=clock), clock=clock)
    sampler.start()  # the first tick runs here
    sampler.mark("start")
    rep = sampler.report()
    assert rep["status"] == "partial"
    assert "the GPU sampler stopped: RuntimeError: bug in a backend" in rep["reason"]
    assert sampler._thread is None


def test_a_gpu_call_that_hangs_does_not_hang_the_run():
    release = threading.Event()

    class Hanging(FakeBackend):
        calls = 0

        def clocks(self, handle):
            Hanging.calls += 1
            if Hanging.calls > 1:  # the thread's first pass hangs in the driver
                release.wait(10)
            return super().clocks(handle)

    sampler = GpuSampler("all", 20, backend=Hanging([_known_device()]))
    sampler.join_s = sampler.lock_s = 0.2
    try:
        sampler.start()
        time.sleep(0.1)
        t0 = time.monotonic()
        sampler.mark("end")
        rep = sampler.report()
        assert time.monotonic() - t0 < 2
        assert rep["status"] == "partial"
        assert "the end mark was skipped: the GPU sampler thread is stuck in a GPU call" in rep["reason"]
        assert rep["devices"][0]["samples"] == 1  # what was read before is kept
    finally:
        release.set()


def test_a_library_that_breaks_at_start_is_unavailable():
    class Broken(FakeBackend):
        def driver_version(self):
            raise OSError("bad ioctl")

    sampler = GpuSampler("all", 100, backend=Broken([_known_device()]))
    sampler.start()
    rep = sampler.report()
    assert rep["status"] == "unavailable" and rep["reason"] == "GPU discovery failed: OSError: bad ioctl"


# ------------------------------------------------------------- unavailable

def test_unavailable_library_gives_a_one_line_reason_and_no_thread():
    backend = FakeBackend([], unavailable="NVML could not start: Driver Not Loaded")
    sampler = GpuSampler("all", 100, backend=backend)
    sampler.start()
    sampler.mark("start")
    sampler.mark("end")
    rep = sampler.report(completed_queries=5)
    assert rep["status"] == "unavailable" and rep["reason"] == "NVML could not start: Driver Not Loaded"
    assert rep["devices"] == [] and rep["energy_j_total"] is None and rep["energy_per_query_j"] is None
    assert sampler._thread is None


def test_no_devices_or_none_selected_is_unavailable():
    rep = GpuSampler("all", 100, backend=FakeBackend([])).report()
    assert rep["status"] == "unavailable"  # never started
    s = GpuSampler("all", 100, backend=FakeBackend([]))
    s.start()
    assert s.report()["reason"] == "no GPU matches --gpus=all"
    backend = FakeBackend([_known_device()])
    s = GpuSampler("none", 100, backend=backend)
    s.start()
    assert s.report()["reason"] == "no GPU selected (--gpus=none)" and not backend.initialised
    s = GpuSampler(parse_gpus("all", {"CUDA_VISIBLE_DEVICES": ""}), 100, backend=FakeBackend([_known_device()]))
    s.start()
    assert s.report()["reason"] == "no GPU selected (CUDA_VISIBLE_DEVICES=none)"


def test_nvml_backend_without_a_driver_is_unavailable():
    pytest.importorskip("pynvml")  # the 'test' extra installs nvidia-ml-py
    sampler = GpuSampler("all", 100)  # NvmlBackend: the real pynvml on this machine
    assert isinstance(sampler.backend, NvmlBackend)
    sampler.start()
    sampler.mark("start")
    rep = sampler.report(completed_queries=1)
    if rep["status"] != "unavailable":
        pytest.skip("this machine has an NVIDIA driver: " + json.dumps(rep["devices"])[:200])
    assert rep["reason"].startswith("NVML could not start: ")
    assert any(w in rep["reason"] for w in ("Library Not Found", "Driver Not Loaded", "Function Not Found"))
    assert "\n" not in rep["reason"] and rep["devices"] == []


def test_nvml_backend_without_pynvml_is_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    sampler = GpuSampler("all", 100)
    sampler.start()
    rep = sampler.report()
    assert rep["status"] == "unavailable"
    assert rep["reason"].startswith("nvidia-ml-py (pynvml) is not installed: pip install 'loadgen[gpu]'")


def test_nvml_errors_translate_to_the_backend_errors():
    pynvml = pytest.importorskip("pynvml")
    from loadgen.telemetry.gpu_backend import GpuError, GpuLost, GpuUnavailable, _field_value, _translate

    def err(code):
        return _translate(pynvml, "nvmlDeviceGetX", pynvml.NVMLError(code))

    assert type(err(pynvml.NVML_ERROR_NOT_SUPPORTED)) is GpuNotSupported
    assert type(err(pynvml.NVML_ERROR_GPU_IS_LOST)) is GpuLost
    assert type(err(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)) is GpuUnavailable
    unknown = err(pynvml.NVML_ERROR_UNKNOWN)
    assert type(unknown) is GpuError and str(unknown) == "nvmlDeviceGetX: Unknown Error"
    v = pynvml.c_nvmlValue_t()
    v.uiVal = 412_345
    assert _field_value(pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, v) == 412_345.0


# ---------------------------------------------------------------- selection

def test_parse_gpus_options():
    assert parse_gpus("all", {}) == GpuSelection("all")
    assert parse_gpus(None) == GpuSelection("all")
    assert parse_gpus(" None ") == GpuSelection("none")
    assert parse_gpus("0,1, 1") == GpuSelection("list", ("0", "1"))
    assert parse_gpus(f"{UA},MIG-abc") == GpuSelection("list", (UA, "MIG-abc"))
    assert parse_gpus("0", {"CUDA_VISIBLE_DEVICES": "1"}) == GpuSelection("list", ("0",))  # the flag wins


@pytest.mark.parametrize("spec,named", [
    ("foo", "'foo' is not a GPU index"),
    ("0,,1", "item 2 of '0,,1' is empty"),
    ("-1", "'-1' is not a GPU index"),
    ("0,all", "'all' cannot be part of a list"),
    ("", "--gpus: empty"),
    ("0,gpu0", "'gpu0' is not a GPU index"),
])
def test_bad_gpus_items_are_named(spec, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        parse_gpus(spec)


@pytest.mark.parametrize("env,mode,items", [
    ({"CUDA_VISIBLE_DEVICES": "1,0"}, "list", ("1", "0")),
    ({"CUDA_VISIBLE_DEVICES": f"{UA},GPU-bbbb"}, "list", (UA, "GPU-bbbb")),
    ({"CUDA_VISIBLE_DEVICES": MIG0}, "list", (MIG0,)),
    ({"CUDA_VISIBLE_DEVICES": "0,-1,1"}, "list", ("0",)),  # CUDA stops at an invalid entry
    ({"CUDA_VISIBLE_DEVICES": ""}, "none", ()),
    ({"CUDA_VISIBLE_DEVICES": "-1"}, "none", ()),
    ({"CUDA_VISIBLE_DEVICES": "1", "NVIDIA_VISIBLE_DEVICES": "all"}, "list", ("1",)),
    ({"NVIDIA_VISIBLE_DEVICES": "all"}, "all", ()),
    ({"NVIDIA_VISIBLE_DEVICES": "none"}, "none", ()),
    ({"NVIDIA_VISIBLE_DEVICES": "void"}, "none", ()),
    ({"NVIDIA_VISIBLE_DEVICES": ""}, "none", ()),
    ({"NVIDIA_VISIBLE_DEVICES": "2,3"}, "all", ()),  # host indexes: the runtime applied them
    ({"NVIDIA_VISIBLE_DEVICES": f"{UB}"}, "list", (UB,)),
])
def test_environment_narrows_all(env, mode, items):
    sel = parse_gpus("all", env)
    assert (sel.mode, sel.items, sel.strict) == (mode, items, False)
    assert sel.source == ("CUDA_VISIBLE_DEVICES" if "CUDA_VISIBLE_DEVICES" in env else "NVIDIA_VISIBLE_DEVICES")


DEVICES = [DeviceInfo(0, UA), DeviceInfo(1, UB, (MIG0, MIG1), mig=True),
           DeviceInfo(2, "GPU-aaaaaaaa-9999-2222-3333-444444444444")]


def test_select_resolves_indexes_uuids_prefixes_and_mig():
    assert select(GpuSelection("all"), DEVICES) == [(0, None), (1, 0), (1, 1), (2, None)]
    assert select(GpuSelection("none"), DEVICES) == []
    assert select(GpuSelection("list", ("2", "0", "2")), DEVICES) == [(2, None), (0, None)]
    assert select(GpuSelection("list", ("1",)), DEVICES) == [(1, 0), (1, 1)]  # a MIG GPU: its MIG devices
    assert select(GpuSelection("list", (UB.lower(),)), DEVICES) == [(1, 0), (1, 1)]
    assert select(GpuSelection("list", ("GPU-bbbb",)), DEVICES) == [(1, 0), (1, 1)]  # unique prefix
    assert select(GpuSelection("list", (MIG1,)), DEVICES) == [(1, 1)]
    assert select(GpuSelection("list", ("MIG-0",)), DEVICES) == [(1, 0)]


def test_select_strict_names_the_bad_item_lenient_stops_there():
    with pytest.raises(ValueError, match=r"--gpus: no GPU has index 7 \(indexes: 0, 1, 2\)"):
        select(GpuSelection("list", ("0", "7")), DEVICES)
    with pytest.raises(ValueError, match="no GPU or MIG device has UUID 'GPU-ffff'"):
        select(GpuSelection("list", ("GPU-ffff",)), DEVICES)
    with pytest.raises(ValueError, match="'GPU-aaaaaaaa' is a prefix of several UUIDs"):
        select(GpuSelection("list", ("GPU-aaaaaaaa",)), DEVICES)
    cuda = GpuSelection("list", ("2", "7", "0"), "CUDA_VISIBLE_DEVICES", strict=False)
    assert select(cuda, DEVICES) == [(2, None)]


def test_sampler_start_rejects_an_unknown_gpu_and_closes_the_library():
    backend = FakeBackend([_known_device()])
    sampler = GpuSampler("0,3", 100, backend=backend)
    with pytest.raises(ValueError, match="no GPU has index 3"):
        sampler.start()
    assert not backend.initialised
    sampler = GpuSampler(parse_gpus("all", {"CUDA_VISIBLE_DEVICES": "3"}), 100, backend=FakeBackend([_known_device()]))
    sampler.start()  # the environment follows CUDA: nothing visible, no error
    assert sampler.report()["reason"] == "no GPU matches CUDA_VISIBLE_DEVICES=3"


@pytest.mark.parametrize("ms", [0, 5, 60_001, "100"])
def test_sample_ms_out_of_range(ms):
    with pytest.raises(ValueError, match="--gpu-sample-ms must be 10 to 60000 ms"):
        GpuSampler("all", ms, backend=FakeBackend([]))


# ------------------------------------------------------------------- thread

def test_thread_samples_in_real_time_and_stops_promptly():
    backend = FakeBackend([FakeDevice(UA, utilization_pct=(90,), power_w=300.0)])
    sampler = GpuSampler("all", 20, backend=backend)
    sampler.start()
    threads = [t for t in threading.enumerate() if t.name == "loadgen-gpu"]
    assert len(threads) == 1 and threads[0].daemon
    sampler.mark("start")
    time.sleep(0.5)
    sampler.mark("end")
    t0 = time.monotonic()
    rep = sampler.report(completed_queries=1000)
    assert time.monotonic() - t0 < 0.5  # an Event wait, not a sleep
    assert not threads[0].is_alive()
    d = rep["devices"][0]
    # ~25 ticks of 20 ms in 0.5 s; a machine busy with other work (a run queue of ten
    # threads on two cores was seen) may run the thread far less often
    assert 5 <= d["samples"] <= 27
    assert d["utilization_pct"]["mean"] == 90.0
    assert d["energy_j"]["total"] == pytest.approx(150.0, rel=0.1)  # 300 W x 0.5 s
    ov = rep["sampler"]
    assert ov["wall_s"] == pytest.approx(0.5, abs=0.2) and 0 <= ov["thread_cpu_s"] < ov["wall_s"]
    assert 0 <= ov["cpu_pct_of_core"] < 50


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_the_thread_keeps_off_the_issue_threads_cpus():
    cpu = max(os.sched_getaffinity(0))
    sampler = GpuSampler("all", 20, backend=FakeBackend([FakeDevice(UA)]), avoid_cpus=[cpu])
    sampler.start()
    (thread,) = [t for t in threading.enumerate() if t.name == "loadgen-gpu"]
    deadline = time.monotonic() + 2
    while cpu in os.sched_getaffinity(thread.native_id) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert os.sched_getaffinity(thread.native_id) == os.sched_getaffinity(0) - {cpu}
    sampler.stop()
    assert cpu in os.sched_getaffinity(0)  # the caller's own affinity is untouched


def test_a_long_period_still_stops_at_once():
    sampler = GpuSampler("all", 60_000, backend=FakeBackend([FakeDevice(UA)]))
    sampler.start()
    t0 = time.monotonic()
    sampler.stop()
    assert time.monotonic() - t0 < 0.5
    sampler.stop()  # idempotent
    assert sampler.report()["devices"][0]["samples"] == 1  # the first readings, taken by start()


# ------------------------------------------------------------ the GPU check


def test_a_costly_energy_counter_is_read_once_a_second_and_a_cheap_one_at_every_tick():
    # On an H200 one read of the energy counter costs about 4 ms of CPU in the driver: at
    # every 100 ms tick that alone was 4% of a core. Such a counter is read once a second
    # (and at every mark); one that costs microseconds, at every tick.
    import time as _time

    from loadgen.telemetry.gpu import ENERGY_READ_S

    for cost_ns, expect in ((0, 30), (400_000, round(3.0 / ENERGY_READ_S))):
        sampler, clock, backend = _sampler([_known_device()])
        reads = []
        real = backend.total_energy_mj

        def costly(handle, real=real, cost_ns=cost_ns, reads=reads, clock=clock):
            end = _time.thread_time_ns() + cost_ns  # CPU time, as the driver spends it
            while _time.thread_time_ns() < end:
                pass
            reads.append(clock())
            return real(handle)

        backend.total_energy_mj = costly
        _drive(sampler, clock, 30)  # 3 s of 100 ms ticks between the start and end marks
        ticks = len(reads) - 2  # less the two marks
        assert expect - 1 <= ticks <= expect + 1, (cost_ns, ticks)
        rep = sampler.report(completed_queries=10)
        assert rep["devices"][0]["energy_j"]["total"] == pytest.approx(400.0 * 3.0)
