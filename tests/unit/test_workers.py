"""The worker contract of a scaled-out run (``loadgen.workers``, ``Scenario.for_worker``,
``--start-at`` in the runner): each worker's seeds, its share of the load, the wait for
the common start, and the ``"worker"`` section of its result.

Runs are short (0.2-0.5 s) against the native null and demo SUTs; the few CLI runs are
subprocesses bounded by a timeout.

The tests that start processes or servers are in tests/integration/test_workers.py.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from loadgen.options import RunOptions, parse_stages, resolve
from loadgen.results import load_result, render_summary, write_outputs
from loadgen.runner import prepare, run_benchmark
from loadgen.scenarios import get_scenario
from loadgen.workers import (
    SAMPLE_STREAM,
    SCHEDULE_STREAM,
    concurrency_share,
    count_share,
    late_start_reason,
    splitmix64,
    stages_text,
    wait_until,
    worker_seed,
)

ALL_SCENARIOS = ("server", "constant", "poisson", "concurrency", "ramp", "trace", "single-stream",
                 "multi-stream", "offline")


def options(**kw) -> RunOptions:
    kw.setdefault("sut", "null")
    return RunOptions(**kw)


def scenario_options(name: str, trace_file: str, **kw) -> RunOptions:
    extra = {"ramp": {"stages": "1s:100,2s:300-600"}, "trace": {"trace": trace_file}}.get(name, {})
    return options(scenario=name, **extra, **kw)


@pytest.fixture
def trace_file(tmp_path):
    path = tmp_path / "arrivals.txt"
    path.write_text("\n".join(str(i) for i in range(10)) + "\n")
    return str(path)


# ------------------------------------------------------------------------------ seeds

def test_splitmix64_is_the_reference_generator():
    # SplitMix64 seeded with 0: its first outputs, as in Vigna's splitmix64.c.
    golden = 0x9E3779B97F4A7C15
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    assert splitmix64(golden) == 0x6E789E6AA1B965F4
    assert splitmix64(2 * golden % 2**64) == 0x06C45D188009454F


def test_worker_seeds_differ_per_worker_and_stream_and_are_reproducible():
    seeds = {(i, s): worker_seed(7, i, s) for i in range(1000) for s in (SCHEDULE_STREAM, SAMPLE_STREAM)}
    assert len(set(seeds.values())) == len(seeds)  # all distinct
    assert all(0 <= v < 2**64 for v in seeds.values())
    assert seeds == {(i, s): worker_seed(7, i, s) for i in range(1000) for s in (SCHEDULE_STREAM, SAMPLE_STREAM)}
    assert worker_seed(8, 0, SCHEDULE_STREAM) != seeds[(0, SCHEDULE_STREAM)]
    assert worker_seed(2**64 - 1, 65535, SAMPLE_STREAM) < 2**64


@pytest.mark.parametrize("name", ALL_SCENARIOS)
def test_worker_0_of_1_is_a_plain_run(name, trace_file):
    o = scenario_options(name, trace_file, seed=5)
    scenario = get_scenario(name)
    assert scenario.for_worker(o) == scenario.effective(o)
    mine = scenario.for_worker(o)
    assert (mine.schedule_seed, mine.sample_seed) == (5, 6)  # today's seeds, exactly
    s1 = scenario.engine_settings(mine)
    s2 = scenario.engine_settings(scenario.effective(o))
    if name == "trace":
        assert np.array_equal(s1.trace_offsets_ns, s2.trace_offsets_ns)
        s1.trace_offsets_ns = s2.trace_offsets_ns = None
    assert s1 == s2


def test_workers_get_derived_seeds_unless_given():
    scenario = get_scenario("poisson")
    seeds = []
    for index in range(3):
        o = scenario.for_worker(options(scenario="poisson", seed=11, workers=3, worker_index=index))
        assert o.schedule_seed == worker_seed(11, index, SCHEDULE_STREAM)
        assert o.sample_seed == worker_seed(11, index, SAMPLE_STREAM)
        seeds.append((o.schedule_seed, o.sample_seed))
    assert len(set(seeds)) == 3
    given = scenario.for_worker(options(scenario="poisson", workers=3, worker_index=2, schedule_seed=4,
                                        sample_seed=9))
    assert (given.schedule_seed, given.sample_seed) == (4, 9)


def test_derived_seeds_give_each_worker_its_own_schedule():
    # The same options, three workers: three different Poisson schedules (counts differ).
    issued = []
    for index in range(3):
        o = options(scenario="poisson", target_qps=3000, duration_s=0.2, workers=3, worker_index=index)
        issued.append(run_benchmark(o)["counts"]["issued"])
    assert len(set(issued)) > 1, issued


# ----------------------------------------------------------------------------- shares

@pytest.mark.parametrize("name", ["server", "constant", "poisson"])
def test_open_loop_workers_run_a_rate_share(name):
    for index in range(4):
        o = get_scenario(name).for_worker(options(scenario=name, target_qps=1000, workers=4, worker_index=index))
        assert o.target_qps == 250
        _, _, settings, _ = prepare(options(scenario=name, target_qps=1000, workers=4, worker_index=index))
        assert settings.target_qps == 250


def test_ramp_workers_divide_every_stage():
    o = get_scenario("ramp").for_worker(options(scenario="ramp", stages="1s:100,2s:300-600", ramp="linear",
                                                workers=3, worker_index=1))
    assert parse_stages(o.stages, o.ramp) == [(1.0, 0.0, 100 / 3), (2.0, 100.0, 200.0)]
    assert parse_stages(stages_text([(1e-5, 0.1, 2.5)])) == [(1e-5, 0.1, 2.5)]


def test_concurrency_shares_add_up_and_a_share_of_zero_is_an_error():
    assert [concurrency_share(10, i, 3) for i in range(3)] == [4, 3, 3]
    assert [concurrency_share(3, i, 3) for i in range(3)] == [1, 1, 1]
    for n, count in ((1, 1), (7, 2), (64, 5), (100, 7)):
        assert sum(concurrency_share(n, i, count) for i in range(count)) == n
    o = get_scenario("concurrency").for_worker(options(scenario="concurrency", concurrency=10, workers=3,
                                                       worker_index=0))
    assert o.concurrency == 4
    with pytest.raises(ValueError, match=r"--concurrency 2 cannot be shared by --workers 3"):
        get_scenario("concurrency").for_worker(options(scenario="concurrency", concurrency=2, workers=3,
                                                       worker_index=0))


def test_query_counts_are_a_ceiling_share():
    assert [count_share(n, 3) for n in (None, 0, 1, 3, 10, 100)] == [None, 0, 1, 1, 4, 34]
    o = get_scenario("server").for_worker(options(scenario="server", query_count=10, workers=3, worker_index=2))
    assert (o.query_count, o.min_query_count) == (4, 34)  # the default 100 MLPerf queries, shared


@pytest.mark.parametrize("name", ["single-stream", "multi-stream", "offline"])
def test_scenarios_that_cannot_be_shared_say_so(name):
    with pytest.raises(ValueError, match=rf"the {name} scenario cannot be shared by --workers 2: .*one worker"):
        get_scenario(name).for_worker(options(scenario=name, workers=2, worker_index=1))


def test_trace_workers_replay_every_nth_line(trace_file):
    offsets = []
    for index in range(3):
        _, _, settings, _ = prepare(options(scenario="trace", trace=trace_file, trace_unit="ms", workers=3,
                                            worker_index=index))
        offsets.append(settings.trace_offsets_ns.tolist())
    assert offsets == [[i * 1_000_000 for i in range(k, 10, 3)] for k in range(3)]
    with pytest.raises(ValueError, match="holds 10 arrivals, too few for --workers 11: worker 10"):
        prepare(options(scenario="trace", trace=trace_file, workers=11, worker_index=10))


def test_the_worker_index_comes_from_the_indexed_job_environment():
    o, _ = resolve({}, {"LOADGEN_WORKERS": "3", "JOB_COMPLETION_INDEX": "2"})
    assert (o.workers, o.worker_index) == (3, 2)


# ------------------------------------------------------------------------ --start-at

def test_wait_until_sleeps_to_the_time_and_can_be_stopped():
    now = [100.0]
    sleeps = []

    def sleep(s):
        sleeps.append(s)
        now[0] += s

    assert wait_until(100.35, clock=lambda: now[0], sleep=sleep)
    assert now[0] >= 100.35 and max(sleeps) <= 0.1 and len(sleeps) == 4
    assert wait_until(99.0, clock=lambda: now[0], sleep=sleep)  # already past: at once
    polls = []
    assert not wait_until(1e9, lambda: len(polls.append(1) or polls) > 3, clock=lambda: now[0], sleep=sleep)


def test_a_run_starts_at_start_at_and_records_the_worker():
    start_at = time.time() + 0.4
    # The issue-delay rule is relaxed: this checks the start and the worker section, and a
    # busy shared machine may delay a few issues past 1 ms.
    doc = run_benchmark(options(scenario="poisson", target_qps=1000, duration_s=0.2, workers=2, worker_index=1,
                                start_at=start_at, max_issue_delay_ms=50.0))
    w = doc["worker"]
    assert (w["index"], w["count"], w["start_at"]) == (1, 2, start_at)
    # On time to a few ms; generous: the test machine's two cores are shared.
    assert 0 <= w["start_late_s"] < 0.25, w
    assert w["started_at_epoch_s"] == pytest.approx(start_at + w["start_late_s"])
    assert w["seeds"] == {"seed": 0, "schedule": worker_seed(0, 1, 0), "sample": worker_seed(0, 1, 1),
                          "derived": True}
    assert w["total"]["target_qps"] == 1000 and doc["settings"]["effective"]["target_qps"] == 500
    assert doc["valid"], doc["invalid_reasons"]
    line = next(x for x in render_summary(doc).splitlines() if x.startswith("worker "))
    assert "1 of 2" in line and "after --start-at" in line


def test_a_plain_run_has_no_worker_section():
    assert "worker" not in run_benchmark(options(scenario="poisson", target_qps=500, duration_s=0.1))


def test_a_late_start_makes_the_worker_invalid_naming_the_lateness(tmp_path):
    doc = run_benchmark(options(scenario="poisson", target_qps=500, duration_s=0.1, workers=3, worker_index=1,
                                start_at=time.time() - 3, start_tolerance_s=1))
    assert not doc["valid"]
    [reason] = [r for r in doc["invalid_reasons"] if "after --start-at" in r]
    assert reason.startswith("worker 1 of 3 started 3.") and "--start-tolerance-s 1" in reason
    assert doc["worker"]["start_late_s"] > 3
    write_outputs(doc, str(tmp_path))  # the section follows the schema
    assert load_result(tmp_path / "result.json")["worker"] == doc["worker"]
    assert late_start_reason({"index": 0, "count": 2, "start_at": 1.0, "start_late_s": 0.5,
                              "start_tolerance_s": 1.0}) is None


def test_a_stop_during_the_wait_raises_keyboard_interrupt():
    t = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_benchmark(options(scenario="poisson", duration_s=0.1, start_at=time.time() + 60),
                      stop_requested=lambda: time.monotonic() - t > 0.2)
    assert time.monotonic() - t < 5


# ---------------------------------------------------------------------------- the CLI


