"""Behaviour of :mod:`loadgen.mlperf`'s runtime: handles, errors, completions, modes.

Every test makes real, short runs (tens to hundreds of milliseconds) with the logs in
the test's own directory. Sections:

* the native query generator (``_core.mlperf_generate`` / ``_core.mlperf_loadable_sets``)
  against what ``mlperf_loadgen`` issues, over many random seeds (64-bit ones too), all
  scenarios and QSL shapes, plus short full runs of both modules for the issue modes
  the generator function does not take (unique / same / concatenated permutations,
  coalescing, accuracy overrides);
* bad handles, unsupported settings, exceptions in issue_query, late, bogus and
  duplicate completions;
* completions from other threads, in any order and batch size; ConstructFastSUT;
* accuracy mode's log and SubmissionRun's sequence of QSL calls;
* token latencies; FindPeakPerformance; long runs; the ways a run ends early.

``mlperf_loadgen`` (PyPI ``mlcommons-loadgen``) is only needed by the first section;
without it those tests skip.

The tests that start processes or servers are in tests/integration/test_mlperf_runtime.py.
"""

from __future__ import annotations

import ctypes
import gc
import heapq
import json
import os
import queue
import random
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import loadgen.mlperf as ours
from loadgen import _core
from loadgen.mlperf import effective as our_effective

try:
    import mlperf_loadgen as ref_lg
except ImportError:  # pragma: no cover - depends on the environment
    ref_lg = None

needs_ref = pytest.mark.skipif(ref_lg is None, reason="mlperf_loadgen is not installed")

MS = 1_000_000  # ns
SCENARIOS = ("SingleStream", "MultiStream", "Server", "Offline")
SCENARIO_NUMBER = {name: i for i, name in enumerate(SCENARIOS)}


# ----------------------------------------------------------------------- log reading


def read_detail(path: Path) -> list[dict]:
    """Every ':::MLLOG {json}' entry of a detail log, in order (each line must parse)."""
    entries = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        assert line.startswith(":::MLLOG "), line
        entries.append(json.loads(line[len(":::MLLOG ") :]))
    return entries


@dataclass
class Run:
    """What one test showed the SUT and the QSL, and what its logs say."""

    issued: list = field(default_factory=list)  # QSL indices, one list per issue call
    ids: list = field(default_factory=list)  # sample ids, one list per issue call
    events: list = field(default_factory=list)  # ("load"|"unload", [...]), ("issue", n), ("flush",)
    detail: list = field(default_factory=list)
    summary: str = ""
    accuracy: list = field(default_factory=list)
    errors: list = field(default_factory=list)  # exceptions in SUT threads
    wall_s: float = 0.0

    @property
    def flat(self) -> list:
        return [i for call in self.issued for i in call]

    @property
    def loads(self) -> list:
        return [e[1] for e in self.events if e[0] == "load"]

    @property
    def unloads(self) -> list:
        return [e[1] for e in self.events if e[0] == "unload"]

    def values(self, key: str) -> list:
        return [e["value"] for e in self.detail if e["key"] == key]

    def one(self, key: str) -> Any:
        values = self.values(key)
        assert len(values) == 1, f"{key}: {values!r}"
        return values[0]

    def last(self, key: str) -> Any:
        values = self.values(key)
        assert values, f"{key} not in the detail log"
        return values[-1]

    def error_lines(self) -> list[str]:
        return [f"{e['key']}: {e['value']}" for e in self.detail if e["metadata"]["is_error"]]

    def messages(self) -> list[str]:
        return [str(v) for v in self.values("generic_message")]

    @property
    def validity(self) -> str | None:
        m = re.search(r"^Result is\s*:\s*(\w+)\s*$", self.summary, re.MULTILINE)
        return m.group(1) if m else None

    def summary_number(self, label: str) -> float:
        m = re.search(rf"^{re.escape(label)}\s*:\s*(\S+)\s*$", self.summary, re.MULTILINE)
        assert m, f"{label!r} not in the summary:\n{self.summary}"
        return float(m.group(1))


def read_logs(run: Run, outdir: Path) -> None:
    run.detail = read_detail(outdir / "mlperf_log_detail.txt")
    run.summary = (outdir / "mlperf_log_summary.txt").read_text()
    text = (outdir / "mlperf_log_accuracy.json").read_text()
    run.accuracy = json.loads(text) if text.strip() else []


def open_paths() -> set[str]:
    """Files this process has open (Linux; empty elsewhere)."""
    fd_dir = "/proc/self/fd"
    if not os.path.isdir(fd_dir):
        return set()
    paths = set()
    for fd in os.listdir(fd_dir):
        try:
            paths.add(os.path.realpath(os.readlink(os.path.join(fd_dir, fd))))
        except OSError:
            pass
    return paths


def assert_logs_closed(outdir: Path) -> None:
    """The three log files exist, are closed, and parse (detail lines, accuracy JSON)."""
    names = ("mlperf_log_summary.txt", "mlperf_log_detail.txt", "mlperf_log_accuracy.json")
    still_open = {str((Path(outdir) / n).resolve()) for n in names} & open_paths()
    assert not still_open, still_open
    read_detail(Path(outdir) / "mlperf_log_detail.txt")
    json.loads((Path(outdir) / "mlperf_log_accuracy.json").read_text())
    summary = (Path(outdir) / "mlperf_log_summary.txt").read_text()
    assert re.search(r"(No errors encountered during test\.|ERRORS? encountered\. See detailed log\.)\n$", summary)


# ------------------------------------------------------------------- running a test


def make_settings(lg, scenario: str, mode: str = "PerformanceOnly", **attrs) -> Any:
    ts = lg.TestSettings()
    ts.scenario = getattr(lg.TestScenario, scenario)
    ts.mode = getattr(lg.TestMode, mode)
    for name, value in attrs.items():
        setattr(ts, name, value)
    return ts


def log_settings(lg, outdir: Path) -> Any:
    ls = lg.LogSettings()
    ls.log_output.outdir = str(outdir)
    if lg is not ours:
        ls.enable_trace = False
    return ls


class SUT:
    """Records the issue calls; ``handle(lg, samples)`` completes them (inline by default)."""

    def __init__(self, lg, run: Run, handle: Callable | None = None, fast: bool = False):
        self.lg = lg
        self.run = run
        self.handle = handle or complete_inline
        self.fast = fast
        self.lock = threading.Lock()

    def issue(self, query_samples) -> None:
        samples = [(s.id, s.index) for s in query_samples]
        self._record(samples)
        self.handle(self.lg, samples)

    def fast_issue(self, ids, indices) -> None:
        assert isinstance(ids, list) and isinstance(indices, list)
        assert all(type(i) is int for i in ids) and all(type(i) is int for i in indices)
        samples = list(zip(ids, indices))
        self._record(samples)
        self.handle(self.lg, samples)

    def _record(self, samples) -> None:
        with self.lock:
            self.run.issued.append([i for _, i in samples])
            self.run.ids.append([r for r, _ in samples])
            self.run.events.append(("issue", len(samples)))

    def flush(self) -> None:
        with self.lock:
            self.run.events.append(("flush",))


def complete_inline(lg, samples) -> None:
    lg.QuerySamplesComplete([lg.QuerySampleResponse(r, 0, 0) for r, _ in samples])


def run_test(
    lg,
    outdir: Path,
    ts,
    *,
    total: int = 256,
    perf: int = 64,
    handle: Callable | None = None,
    fast: bool = False,
    flush: Callable | None = None,
    start: Callable | None = None,
    stop: Callable | None = None,
    load: Callable | None = None,
    logs=None,
) -> Run:
    """One StartTestWithLogSettings with a recording SUT and QSL; reads the logs back."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    run = Run()
    sut_obj = SUT(lg, run, handle, fast)

    def on_load(indices):
        run.events.append(("load", [int(i) for i in indices]))
        if load is not None:
            load(indices)

    def on_unload(indices):
        run.events.append(("unload", [int(i) for i in indices]))

    def on_flush():
        sut_obj.flush()
        if flush is not None:
            flush()

    if fast:
        sut = lg.ConstructFastSUT(sut_obj.fast_issue, on_flush)
    else:
        sut = lg.ConstructSUT(sut_obj.issue, on_flush)
    qsl = lg.ConstructQSL(total, perf, on_load, on_unload)
    if start is not None:
        start()
    t0 = time.monotonic()
    try:
        lg.StartTestWithLogSettings(sut, qsl, ts, logs or log_settings(lg, outdir))
    finally:
        run.wall_s = time.monotonic() - t0
        if stop is not None:
            stop()
        lg.DestroyQSL(qsl)
        if fast:
            lg.DestroyFastSUT(sut)
        else:
            lg.DestroySUT(sut)
    read_logs(run, outdir)
    return run


def seed_attrs(seeds) -> dict:
    q, s, sch = seeds
    return {"qsl_rng_seed": q, "sample_index_rng_seed": s, "schedule_rng_seed": sch}


def random_seeds(rng: random.Random) -> tuple[int, int, int]:
    """Seeds: 64-bit ones (above 2**63 too), 32-bit ones and small ones."""

    def one() -> int:
        kind = rng.randrange(3)
        return rng.getrandbits(64) if kind == 0 else rng.getrandbits(32) if kind == 1 else rng.randrange(100)

    return one(), one(), one()


class WorkerPool:
    """Worker threads that take queued samples and complete them in random order and
    random-size batches (``delay_s`` before each batch, drawn in [0, max_delay_s])."""

    def __init__(self, lg, threads: int, seed: int, max_batch: int = 8, max_delay_s: float = 0.0005):
        self.lg = lg
        self.q: queue.Queue = queue.Queue()
        self.rng = random.Random(seed)
        self.rng_lock = threading.Lock()
        self.max_batch = max_batch
        self.max_delay_s = max_delay_s
        self.errors: list = []
        self.calls = 0
        self.threads = [threading.Thread(target=self._work, daemon=True) for _ in range(threads)]

    def handle(self, lg, samples) -> None:
        for s in samples:
            self.q.put(s)

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        for _ in self.threads:
            self.q.put(None)
        for t in self.threads:
            t.join(timeout=30)

    def _work(self) -> None:
        while True:
            first = self.q.get()
            if first is None:
                return
            batch = [first]
            with self.rng_lock:
                want = self.rng.randint(1, self.max_batch)
                delay = self.rng.uniform(0, self.max_delay_s)
            stop = False
            while len(batch) < want:
                try:
                    item = self.q.get(timeout=0.0002)
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            with self.rng_lock:
                self.rng.shuffle(batch)
                cut = self.rng.randint(0, len(batch))
            try:
                if delay:
                    time.sleep(delay)
                for part in (batch[:cut], batch[cut:]):
                    if part:
                        complete_inline(self.lg, part)
                        self.calls += 1
            except Exception as e:
                self.errors.append(repr(e))
            if stop:
                return


@pytest.fixture
def no_gc_pauses():
    """For tests that judge latencies in milliseconds: a full collection of a large
    heap (this process runs many tests) stalls the issuing thread for tens of ms."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


@pytest.fixture
def restore_options():
    """loadgen.mlperf.options, put back as they were after the test."""
    saved = dict(vars(ours.options))
    yield ours.options
    for name, value in saved.items():
        setattr(ours.options, name, value)


# ============================================================ 1. generator agreement


def _ref_and_ours_settings(scenario: str, mode: str, attrs: dict):
    return make_settings(ref_lg, scenario, mode, **attrs), make_settings(ours, scenario, mode, **attrs)


def _expected_from_generator(scenario: str, accuracy: bool, ts, total: int, perf: int):
    """(load sets, issue calls, generated query counts) from the native generator."""
    eff = our_effective.effective_settings(ts, perf, total)
    padding = int(eff.samples_per_query) - 1 if scenario == "MultiStream" else 0
    count = int(eff.accuracy_sample_count) if accuracy else int(eff.performance_sample_count)
    sets = _core.mlperf_loadable_sets(
        total_sample_count=count,
        qsl_total_count=total,
        set_size=int(eff.performance_sample_count),
        padding=padding,
        qsl_rng_seed=int(eff.qsl_rng_seed),
    )
    if not accuracy:
        sets = sets[:1]
    calls, counts, periods = [], [], []
    for loaded in sets:
        gen = _core.mlperf_generate(
            scenario=SCENARIO_NUMBER[scenario],
            accuracy=accuracy,
            loaded_samples=loaded,
            sample_distribution_end=len(loaded) - padding,
            samples_per_query=int(eff.samples_per_query),
            target_duration_ns=int(eff.target_duration_ns),
            min_query_count=int(eff.min_query_count),
            target_qps=float(eff.target_qps),
            sample_index_rng_seed=int(eff.sample_index_rng_seed),
            schedule_rng_seed=int(eff.schedule_rng_seed),
        )
        offsets = [t for t, _ in gen]
        assert offsets == sorted(offsets)
        calls += [list(s) for _, s in gen]
        counts.append(len(gen))
        periods.append(offsets)
    return sets, calls, counts, periods, eff


def _generator_cases(n: int, seed: int) -> list:
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        scenario = SCENARIOS[i % 4]
        accuracy = (i // 4) % 3 == 2
        spq = (1, 2, 8, 13)[(i // 4) % 4] if scenario == "MultiStream" else 1
        total = rng.randint(max(spq, 3), 160)
        perf = rng.choice([total, rng.randint(1, total), max(1, total // 3)])
        attrs = seed_attrs(random_seeds(rng))
        attrs["min_query_count"] = rng.randint(1, 40)
        if scenario == "SingleStream":
            # 2 x 200 ms / expected latency queries: an instant SUT issues them all
            # long before the min duration (ending by running out of queries).
            attrs.update(min_duration_ms=200, single_stream_expected_latency_ns=rng.choice([4, 8, 10]) * MS)
        elif scenario == "MultiStream":
            attrs.update(
                min_duration_ms=200,
                multi_stream_expected_latency_ns=rng.choice([4, 8, 10]) * MS,
                multi_stream_samples_per_query=spq,
            )
        elif scenario == "Server":
            # Server issues every generated query (its duration is real time).
            attrs.update(min_duration_ms=rng.choice([20, 40]), server_target_qps=float(rng.choice([1000, 2500])))
        else:
            attrs.update(min_duration_ms=50, offline_expected_qps=float(rng.randint(10, 4000)))
        if accuracy and rng.random() < 0.5:
            attrs["accuracy_sample_count_override"] = rng.randint(1, total)
        cases.append((scenario, "AccuracyOnly" if accuracy else "PerformanceOnly", total, perf, attrs))
    return cases


GENERATOR_CASES = _generator_cases(48, 20240611)


@needs_ref
@pytest.mark.parametrize("case", range(0, len(GENERATOR_CASES), 12), ids=lambda c: f"cases{c}")
def test_generator_matches_mlperf_issue(tmp_path, case):
    """The generator's queries and the loadable sets are what mlperf_loadgen issues and
    loads, over random seeds (64-bit too), every scenario and QSL shape."""
    for k, (scenario, mode, total, perf, attrs) in enumerate(GENERATOR_CASES[case : case + 12]):
        what = f"{scenario} {mode} total={total} perf={perf} {attrs}"
        ref_ts, our_ts = _ref_and_ours_settings(scenario, mode, attrs)
        ref = run_test(ref_lg, tmp_path / f"ref{k}", ref_ts, total=total, perf=perf)
        accuracy = mode == "AccuracyOnly"
        sets, calls, counts, offsets, eff = _expected_from_generator(scenario, accuracy, our_ts, total, perf)
        assert ref.loads == sets, what
        assert ref.unloads == sets, what
        assert ref.issued == calls, what
        assert ref.values("generated_query_count") == counts, what
        # Samples per query, per loaded set: the size of the set's first query.
        firsts = [sum(counts[:j]) for j in range(len(counts))]
        assert ref.values("generated_samples_per_query") == [len(calls[f]) for f in firsts], what
        if scenario in ("SingleStream", "MultiStream") and not accuracy:
            # The generated duration is one period past the last query's offset.
            period = offsets[0][1] - offsets[0][0] if len(offsets[0]) > 1 else None
            if period is not None:
                assert ref.one("generated_query_duration") == offsets[0][-1] + period, what
        if scenario == "Server" and not accuracy:
            assert offsets[0][-1] < ref.one("generated_query_duration"), what
            # Generation stops at the first query at or past the duration and count.
            assert offsets[0][-1] >= int(eff.target_duration_ns) and len(calls) >= attrs["min_query_count"], what
            assert len(calls) == attrs["min_query_count"] or offsets[0][-2] < int(eff.target_duration_ns), what


def _mode_cases(seed: int) -> list:
    """Full-run cases for the issue modes mlperf_generate does not take."""
    rng = random.Random(seed)
    ss = {"min_duration_ms": 200, "single_stream_expected_latency_ns": 10 * MS}
    ms = {"min_duration_ms": 200, "multi_stream_expected_latency_ns": 10 * MS}
    sv = {"min_duration_ms": 30, "server_target_qps": 2000.0}
    off = {"min_duration_ms": 50, "offline_expected_qps": 1000.0}
    cases = []
    for scenario, base in (("SingleStream", ss), ("MultiStream", ms), ("Server", sv), ("Offline", off)):
        extra = {"multi_stream_samples_per_query": 8} if scenario == "MultiStream" else {}
        cases.append((scenario, "PerformanceOnly", 60, 24, {**base, **extra, "performance_issue_unique": True}))
        index = rng.randrange(24)
        cases.append(
            (scenario, "PerformanceOnly", 60, 24,
             {**base, **extra, "performance_issue_same": True, "performance_issue_same_index": index})
        )
    cases.append(("SingleStream", "PerformanceOnly", 70, 11, {**ss, "sample_concatenate_permutation": True}))
    cases.append(("SingleStream", "PerformanceOnly", 64, 16, {**ss, "sample_concatenate_permutation": True}))
    cases.append(("Offline", "PerformanceOnly", 70, 13, {**off, "sample_concatenate_permutation": True}))
    cases.append(("Offline", "PerformanceOnly", 70, 16, {**off, "sample_concatenate_permutation": True}))
    cases.append(("SingleStream", "AccuracyOnly", 90, 20, {**ss, "accuracy_sample_count_override": 47}))
    cases.append(("Offline", "AccuracyOnly", 90, 20, {**off, "accuracy_sample_count_override": 61}))
    cases.append(("MultiStream", "AccuracyOnly", 50, 12, {**ms, "multi_stream_samples_per_query": 5}))
    cases.append(("MultiStream", "PerformanceOnly", 50, 7, {**ms, "multi_stream_samples_per_query": 13}))
    for case in cases:
        case[4].update(seed_attrs(random_seeds(rng)))
        case[4].setdefault("min_query_count", 10)
    return cases


MODE_CASES = _mode_cases(77)


@needs_ref
def test_issue_modes_match_mlperf(tmp_path):
    """performance_issue_unique / _same (+index), sample_concatenate_permutation,
    accuracy_sample_count_override and MultiStream padding: our run issues and loads
    what mlperf_loadgen does (instant SUTs, random seeds)."""
    for k, (scenario, mode, total, perf, attrs) in enumerate(MODE_CASES):
        what = f"{scenario} {mode} total={total} perf={perf} {attrs}"
        ref_ts, our_ts = _ref_and_ours_settings(scenario, mode, attrs)
        ref = run_test(ref_lg, tmp_path / f"ref{k}", ref_ts, total=total, perf=perf)
        got = run_test(ours, tmp_path / f"ours{k}", our_ts, total=total, perf=perf)
        assert got.events == ref.events, what
        assert got.issued == ref.issued, what
        for key in ("generated_query_count", "generated_samples_per_query", "generated_query_duration"):
            assert got.values(key) == ref.values(key), f"{key}: {what}"
        if attrs.get("performance_issue_same"):
            loaded, index = ref.loads[0], attrs["performance_issue_same_index"]
            spq = attrs.get("multi_stream_samples_per_query", 1) if scenario == "MultiStream" else 1
            if scenario == "Offline":
                assert set(ref.flat) == {loaded[index]}, what
            else:
                assert all(c == loaded[index : index + spq] for c in ref.issued), what
        if attrs.get("performance_issue_unique") and scenario != "MultiStream":
            assert len(set(ref.flat)) == len(ref.flat), what


class SlowEveryTenth:
    """Completes inline; every tenth issue call first takes 5 ms (queries pile up)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, lg, samples) -> None:
        self.calls += 1
        if self.calls % 10 == 1:
            time.sleep(0.005)
        complete_inline(lg, samples)


@needs_ref
def test_server_coalesce_matches_mlperf(tmp_path):
    """server_coalesce_queries: the concatenated issue sequence agrees (how queries are
    grouped into calls depends on timing); a slow issue_query makes ours coalesce."""
    rng = random.Random(5)
    for k in range(3):
        attrs = {"min_duration_ms": 60, "server_target_qps": 3000.0, "server_coalesce_queries": True,
                 "min_query_count": 20, **seed_attrs(random_seeds(rng))}
        ref_ts, our_ts = _ref_and_ours_settings("Server", "PerformanceOnly", attrs)
        ref = run_test(ref_lg, tmp_path / f"ref{k}", ref_ts, total=200, perf=50, handle=SlowEveryTenth())
        got = run_test(ours, tmp_path / f"ours{k}", our_ts, total=200, perf=50, handle=SlowEveryTenth())
        assert got.flat == ref.flat
        assert got.loads == ref.loads
        assert max(len(c) for c in got.issued) > 1, "no call carried more than one query"
        assert got.one("result_query_count") == len(got.flat)


# ============================================================ 2. errors and edges


def test_bad_handles(tmp_path):
    sut = ours.ConstructSUT(lambda qs: None, lambda: None)
    qsl = ours.ConstructQSL(10, 10, lambda s: None, lambda s: None)
    ts = make_settings(ours, "SingleStream", min_duration_ms=50)
    with pytest.raises((TypeError, ValueError), match="SUT"):
        ours.StartTestWithLogSettings(qsl, qsl, ts, log_settings(ours, tmp_path))
    with pytest.raises((TypeError, ValueError), match="SUT"):
        ours.StartTest(qsl, qsl, ts)
    with pytest.raises((TypeError, ValueError), match="QSL"):
        ours.StartTestWithLogSettings(sut, sut, ts, log_settings(ours, tmp_path))
    with pytest.raises((TypeError, ValueError)):
        ours.StartTestWithLogSettings(sut, 10**9, ts, log_settings(ours, tmp_path))
    with pytest.raises((TypeError, ValueError)):
        ours.DestroySUT(qsl)
    with pytest.raises((TypeError, ValueError)):
        ours.DestroyQSL(sut)
    ours.DestroySUT(sut)
    with pytest.raises((TypeError, ValueError)):
        ours.DestroySUT(sut)
    with pytest.raises((TypeError, ValueError)):
        ours.StartTestWithLogSettings(sut, qsl, ts, log_settings(ours, tmp_path))
    ours.DestroyQSL(qsl)
    with pytest.raises((TypeError, ValueError)):
        ours.DestroyQSL(qsl)
    with pytest.raises(TypeError):
        ours.ConstructSUT("not callable", lambda: None)
    with pytest.raises(TypeError):
        ours.ConstructQSL(-1, 1, lambda s: None, lambda s: None)
    fast = ours.ConstructFastSUT(lambda ids, idx: None, lambda: None)
    ours.DestroyFastSUT(fast)
    with pytest.raises((TypeError, ValueError)):
        ours.DestroyFastSUT(fast)


@pytest.mark.parametrize(
    "where, name, value",
    [
        ("log", "enable_trace", True),
        ("test", "server_num_issue_query_threads", 2),
    ],
)
def test_unsupported_settings_name_the_setting(tmp_path, where, name, value):
    ts = make_settings(ours, "Server", min_duration_ms=50, server_target_qps=100.0)
    logs = log_settings(ours, tmp_path)
    setattr(logs if where == "log" else ts, name, value)
    issued = []
    sut = ours.ConstructSUT(issued.append, lambda: None)
    qsl = ours.ConstructQSL(10, 10, lambda s: None, lambda s: None)
    try:
        with pytest.raises(NotImplementedError, match=name):
            ours.StartTestWithLogSettings(sut, qsl, ts, logs)
    finally:
        ours.DestroySUT(sut)
        ours.DestroyQSL(qsl)
    assert issued == []


def test_construct_qdl_is_a_sut_that_names_itself(tmp_path):
    names = []

    def name():
        names.append(1)
        return "RemoteSUT"

    qdl = ours.ConstructQDL(lambda qs: complete_inline(ours, [(q.id, q.index) for q in qs]), lambda: None, name)
    qsl = ours.ConstructQSL(10, 10, lambda s: None, lambda s: None)
    ts = make_settings(ours, "SingleStream", min_duration_ms=20, min_query_count=10)
    try:
        ours.StartTestWithLogSettings(qdl, qsl, ts, log_settings(ours, tmp_path))
    finally:
        ours.DestroyQDL(qdl)
        ours.DestroyQSL(qsl)
    assert names == [1]
    assert "SUT name : RemoteSUT" in (tmp_path / "mlperf_log_summary.txt").read_text()
    with pytest.raises((TypeError, ValueError)):
        ours.DestroyQDL(qdl)


class IssueFailed(Exception):
    pass


@pytest.mark.parametrize("scenario", ["SingleStream", "Server", "Offline"])
def test_exception_in_issue_query_propagates(tmp_path, scenario):
    calls = [0]

    def fail_on_fifth(lg, samples):
        calls[0] += 1
        if calls[0] == 5 or scenario == "Offline":
            raise IssueFailed("the SUT broke")
        complete_inline(lg, samples)

    ts = make_settings(ours, scenario, min_duration_ms=100, min_query_count=20,
                       server_target_qps=2000.0, single_stream_expected_latency_ns=MS)
    with pytest.raises(IssueFailed, match="the SUT broke"):
        run_test(ours, tmp_path, ts, handle=fail_on_fifth)
    detail = read_detail(tmp_path / "mlperf_log_detail.txt")  # every line parses
    errors = [e for e in detail if e["metadata"]["is_error"]]
    assert any("IssueFailed" in str(e["value"]) for e in errors), errors
    summary = (tmp_path / "mlperf_log_summary.txt").read_text()
    assert "ERROR" in summary and summary.endswith("See detailed log.\n")
    assert json.loads((tmp_path / "mlperf_log_accuracy.json").read_text()) == []
    assert any(e["key"] == "num_errors" for e in detail)
    # What was measured before the error is reported, never as VALID.
    assert "Result is : INVALID" in summary
    validity = [e["value"] for e in detail if e["key"] == "result_validity"]
    assert validity == ["INVALID"]
    assert any("interrupted" in str(e["value"]) for e in errors), errors
    assert_logs_closed(tmp_path)
    # The module is usable again afterwards.
    again = run_test(ours, tmp_path / "again", make_settings(ours, "SingleStream", min_duration_ms=50,
                                                           min_query_count=10))
    assert again.one("loadgen_unknown_completions") == 0


def test_late_and_unknown_completions(tmp_path):
    """Completions after StartTest returned are ignored; bogus ids are counted."""
    held = []

    def complete_and_bogus(lg, samples):
        held.extend(samples)
        complete_inline(lg, samples)
        if len(held) == 3:
            lg.QuerySamplesComplete([lg.QuerySampleResponse(10**12, 0, 0), lg.QuerySampleResponse(0, 0, 0)])

    ts = make_settings(ours, "SingleStream", min_duration_ms=50, min_query_count=20,
                       single_stream_expected_latency_ns=10 * MS)
    run = run_test(ours, tmp_path, ts, handle=complete_and_bogus)
    assert run.one("loadgen_unknown_completions") == 2
    assert any("not in flight" in line for line in run.error_lines())
    assert run.one("result_query_count") == len(run.flat)
    # After the test: ignored without an error, and they leave the next run alone.
    complete_inline(ours, held)
    ours.FirstTokenComplete([ours.QuerySampleResponse(r, 0, 0) for r, _ in held])
    again = run_test(ours, tmp_path / "again", ts)
    assert again.one("loadgen_unknown_completions") == 0
    assert again.one("result_query_count") == len(again.flat)


def test_incomplete_samples_time_out_then_late_completion_is_ignored(tmp_path, monkeypatch):
    """options.completion_timeout_s: a sample the SUT never completes ends the run after
    the timeout with an error line; completing it after StartTest returned is ignored."""
    monkeypatch.setattr(ours.options, "completion_timeout_s", 0.2)
    seen: list = []
    held: list = []

    def hold_the_ninth(lg, samples):
        seen.append(samples)
        if len(seen) == 9:
            held.extend(samples)  # never completed during the test
        else:
            complete_inline(lg, samples)

    ts = make_settings(ours, "Server", min_duration_ms=30, min_query_count=10, server_target_qps=500.0,
                       server_target_latency_ns=100 * MS)
    run = run_test(ours, tmp_path, ts, handle=hold_the_ninth)
    assert len(held) == 1
    assert any(line.endswith(f"{len(held)} issued samples were not completed within 0.2 s; they are left "
                             "out of the results") for line in run.error_lines()), run.error_lines()
    assert run.one("loadgen_samples_issued") == len(run.flat)
    complete_inline(ours, held)  # after StartTest returned: ignored
    again = run_test(ours, tmp_path / "again", ts)
    assert again.one("loadgen_unknown_completions") == 0


def test_duplicate_completions_are_counted_not_applied(tmp_path):
    def twice(lg, samples):
        complete_inline(lg, samples)
        complete_inline(lg, samples)

    ts = make_settings(ours, "SingleStream", min_duration_ms=50, min_query_count=30,
                       single_stream_expected_latency_ns=10 * MS)
    run = run_test(ours, tmp_path, ts, handle=twice)
    n = len(run.flat)
    assert run.one("result_query_count") == n
    assert run.one("loadgen_samples_issued") == n
    assert run.one("loadgen_unknown_completions") == n

    # MultiStream: one sample of the query completed twice in one call, in the middle.
    def dup_one(lg, samples):
        lg.QuerySamplesComplete([lg.QuerySampleResponse(r, 0, 0) for r, _ in samples[:2]] * 2)
        lg.QuerySamplesComplete([lg.QuerySampleResponse(r, 0, 0) for r, _ in samples[2:]])

    ts = make_settings(ours, "MultiStream", min_duration_ms=50, min_query_count=20,
                       multi_stream_expected_latency_ns=10 * MS, multi_stream_samples_per_query=4)
    run = run_test(ours, tmp_path / "multi", ts, handle=dup_one)
    queries = len(run.issued)
    assert run.one("result_query_count") == queries
    assert run.one("loadgen_samples_issued") == 4 * queries
    assert run.one("loadgen_unknown_completions") == 2 * queries


def test_start_test_is_not_reentrant(tmp_path):
    ts = make_settings(ours, "SingleStream", min_duration_ms=50)
    inner = []

    def start_again(lg, samples):
        inner.append(samples)
        lg.StartTestWithLogSettings(sut, qsl, ts, log_settings(ours, tmp_path / "inner"))

    sut = ours.ConstructSUT(lambda qs: start_again(ours, qs), lambda: None)
    qsl = ours.ConstructQSL(10, 10, lambda s: None, lambda s: None)
    try:
        with pytest.raises(RuntimeError, match="already running"):
            ours.StartTestWithLogSettings(sut, qsl, ts, log_settings(ours, tmp_path))
    finally:
        ours.DestroySUT(sut)
        ours.DestroyQSL(qsl)
    assert len(inner) == 1
    assert_logs_closed(tmp_path)
    # The lock was released: a later test runs.
    run = run_test(ours, tmp_path / "after", make_settings(ours, "SingleStream", min_duration_ms=50,
                                                           min_query_count=5))
    assert run.one("result_query_count") == len(run.issued)


def test_qsl_without_performance_samples(tmp_path):
    ts = make_settings(ours, "SingleStream", min_duration_ms=50)
    with pytest.raises(ValueError, match="performance_sample_count"):
        run_test(ours, tmp_path, ts, total=10, perf=0)
    assert_logs_closed(tmp_path)
    # performance_sample_count_override makes it runnable.
    ts.performance_sample_count_override = 4
    ts.min_query_count = 5
    run = run_test(ours, tmp_path / "override", ts, total=10, perf=0)
    assert len(run.loads[0]) == 4 and set(run.flat) <= set(run.loads[0])


def test_stale_completions_of_reused_slots_are_unknown(tmp_path, restore_options):
    """With a two-slot tracking table, completing query k again while query k+2 holds
    its slot is counted as unknown and leaves query k+2 alone."""
    restore_options.table_capacity = 2
    done = []

    def complete_then_stale(lg, samples):
        done.append(samples)
        complete_inline(lg, samples)
        if len(done) > 2:
            complete_inline(lg, done[-3])

    ts = make_settings(ours, "SingleStream", min_duration_ms=200, min_query_count=20,
                       single_stream_expected_latency_ns=10 * MS)
    run = run_test(ours, tmp_path, ts, handle=complete_then_stale)
    n = len(run.issued)
    assert n > 20
    assert run.one("result_query_count") == n
    assert run.one("loadgen_unknown_completions") == n - 2

    # Server with more queries outstanding than slots: issuing waits for room.
    pool = WorkerPool(ours, threads=2, seed=8, max_batch=4, max_delay_s=0.002)
    restore_options.table_capacity = 4
    ts = make_settings(ours, "Server", min_duration_ms=100, min_query_count=100, server_target_qps=2000.0,
                       server_target_latency_ns=100 * MS)
    run = run_test(ours, tmp_path / "server", ts, handle=pool.handle, start=pool.start, stop=pool.stop)
    assert pool.errors == []
    assert run.one("loadgen_samples_issued") == len(run.flat) >= 100
    assert run.one("loadgen_unknown_completions") == 0


def test_log_output_names(tmp_path, capsys):
    ts = make_settings(ours, "SingleStream", min_duration_ms=50, min_query_count=5)
    logs = ours.LogSettings()
    logs.log_output.outdir = str(tmp_path / "named")
    logs.log_output.prefix = "p_"
    logs.log_output.suffix = "_s"
    logs.log_output.copy_summary_to_stdout = True
    sut = ours.ConstructSUT(lambda qs: complete_inline(ours, [(q.id, q.index) for q in qs]), lambda: None)
    qsl = ours.ConstructQSL(10, 10, lambda s: None, lambda s: None)
    try:
        ours.StartTestWithLogSettings(sut, qsl, ts, logs)
        assert "MLPerf Results Summary" in capsys.readouterr().out
        assert sorted(os.listdir(tmp_path / "named")) == [
            "p_accuracy_s.json", "p_detail_s.txt", "p_summary_s.txt"]
        # StartTest: the default log settings, logs in the working directory.
        ours.StartTest(sut, qsl, ts)
        assert_logs_closed(Path.cwd())
    finally:
        ours.DestroySUT(sut)
        ours.DestroyQSL(qsl)


def test_find_peak_needs_server(tmp_path):
    ts = make_settings(ours, "SingleStream", "FindPeakPerformance", min_duration_ms=50)
    run = run_test(ours, tmp_path, ts)
    assert run.issued == []
    assert any("only supported in the Server scenario" in line for line in run.error_lines())
    assert "ERROR" in run.summary


# ============================================================ 3. completions from threads


def test_server_pool_completes_in_random_order_and_batches(tmp_path, no_gc_pauses):
    pool = WorkerPool(ours, threads=4, seed=3, max_batch=6)
    ts = make_settings(ours, "Server", min_duration_ms=300, min_query_count=500, server_target_qps=2000.0,
                       server_target_latency_ns=100 * MS, **seed_attrs((1, 2, 3)))
    run = run_test(ours, tmp_path, ts, handle=pool.handle, start=pool.start, stop=pool.stop)
    assert pool.errors == []
    n = len(run.flat)
    assert n >= 500
    assert run.one("result_query_count") == n
    assert run.one("loadgen_samples_issued") == n
    assert run.one("loadgen_unknown_completions") == 0
    assert run.validity == "VALID", run.summary


def test_multistream_samples_completed_by_different_threads(tmp_path, no_gc_pauses):
    pool = WorkerPool(ours, threads=4, seed=4, max_batch=5)
    ts = make_settings(ours, "MultiStream", min_duration_ms=100, min_query_count=100,
                       multi_stream_expected_latency_ns=MS, multi_stream_samples_per_query=8,
                       multi_stream_target_latency_percentile=0.9)
    run = run_test(ours, tmp_path, ts, handle=pool.handle, start=pool.start, stop=pool.stop)
    assert pool.errors == []
    queries = len(run.issued)
    assert queries >= 100 and all(len(c) == 8 for c in run.issued)
    assert run.one("result_query_count") == queries
    assert run.one("loadgen_samples_issued") == 8 * queries
    assert run.one("loadgen_unknown_completions") == 0
    assert run.validity == "VALID", run.summary


def test_offline_10k_samples_completed_in_chunks_from_three_threads(tmp_path, no_gc_pauses):
    work: queue.Queue = queue.Queue()
    errors: list = []

    def handle(lg, samples):
        assert len(samples) == 10_000
        rng = random.Random(9)
        shuffled = list(samples)
        rng.shuffle(shuffled)
        chunks = []
        while sum(map(len, chunks)) < len(shuffled):
            k = sum(map(len, chunks))
            chunks.append(shuffled[k : k + rng.randint(1, 400)])
        # Spread over 80 ms (past the 50 ms min duration): chunk j is due at (j+1)/n of it.
        t0 = time.perf_counter()
        for j, chunk in enumerate(chunks):
            work.put((t0 + 0.08 * (j + 1) / len(chunks), chunk))

    def worker():
        while True:
            item = work.get()
            if item is None:
                return
            due, chunk = item
            try:
                time.sleep(max(0.0, due - time.perf_counter()))
                complete_inline(ours, chunk)
            except Exception as e:
                errors.append(repr(e))

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(3)]

    def stop():
        for _ in threads:
            work.put(None)
        for t in threads:
            t.join(timeout=30)

    ts = make_settings(ours, "Offline", min_duration_ms=50, min_query_count=10_000, offline_expected_qps=1.0)
    run = run_test(ours, tmp_path, ts, total=20_000, perf=5_000, handle=handle,
                   start=lambda: [t.start() for t in threads], stop=stop)
    assert errors == []
    assert len(run.issued) == 1 and len(run.flat) == 10_000
    assert run.one("loadgen_samples_issued") == 10_000
    assert run.one("loadgen_unknown_completions") == 0
    assert run.validity == "VALID", run.summary
    per_s = run.summary_number("Samples per second")
    assert per_s == pytest.approx(10_000 / (run.one("result_max_latency_ns") / 1e9), rel=1e-3)


def test_complete_inside_issue_query_is_valid(tmp_path, no_gc_pauses):
    ts = make_settings(ours, "SingleStream", min_duration_ms=60, min_query_count=100,
                       single_stream_expected_latency_ns=1_000)
    run = run_test(ours, tmp_path, ts)
    assert len(run.flat) >= 100
    assert run.one("result_query_count") == len(run.flat)
    assert run.validity == "VALID", run.summary
    assert run.error_lines() == []


# ============================================================ 4. ConstructFastSUT


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_fast_sut_gets_the_same_queries(tmp_path, scenario):
    attrs = {
        "min_duration_ms": 200 if scenario in ("SingleStream", "MultiStream") else 40,
        "min_query_count": 30,
        "single_stream_expected_latency_ns": 10 * MS,
        "multi_stream_expected_latency_ns": 10 * MS,
        "multi_stream_samples_per_query": 3,
        "server_target_qps": 1500.0,
        "offline_expected_qps": 2000.0,
        **seed_attrs((2085463073848966840, 2747215439041700203, 16159082839903944936)),
    }
    plain = run_test(ours, tmp_path / "plain", make_settings(ours, scenario, **attrs), total=100, perf=40)
    fast = run_test(ours, tmp_path / "fast", make_settings(ours, scenario, **attrs), total=100, perf=40,
                    fast=True)
    assert fast.issued == plain.issued
    assert fast.events == plain.events
    assert [len(c) for c in fast.ids] == [len(c) for c in fast.issued]
    assert len({i for c in fast.ids for i in c}) == len(fast.flat)  # ids are unique
    assert fast.one("result_query_count") == plain.one("result_query_count")
    assert fast.one("loadgen_unknown_completions") == 0
    assert "PyFastSUT" in fast.summary


@pytest.mark.parametrize("mode", ["AccuracyOnly", "SubmissionRun"])
def test_fast_sut_in_accuracy_mode(tmp_path, mode):
    """A fast SUT gets (ids, indices) in accuracy runs too, and its responses are logged."""
    ts = make_settings(ours, "SingleStream", mode, min_duration_ms=50, min_query_count=10,
                       single_stream_expected_latency_ns=1_000, **seed_attrs((3, 4, 5)))
    run = run_test(ours, tmp_path, ts, total=30, perf=12, fast=True)
    sets = _core.mlperf_loadable_sets(total_sample_count=30, qsl_total_count=30, set_size=12, padding=0,
                                      qsl_rng_seed=3)
    assert run.loads[: len(sets)] == sets
    assert len(run.accuracy) == 30
    assert {e["qsl_idx"] for e in run.accuracy} == set(range(30))


# ============================================================ 5. accuracy mode


class ArrayResponder:
    """Responds with a numpy array per sample. With ``via_callback`` the array is zero
    when QuerySamplesComplete is called and response_cb fills it (as a device copy)."""

    def __init__(self, via_callback: bool):
        self.via_callback = via_callback
        self.keep: dict = {}  # id -> (array, expected bytes)
        self.cb_ids: list = []
        self.cb_seen_zero = True

    @staticmethod
    def payload(index: int) -> bytes:
        n = index % 6
        return bytes((index * 7 + k) % 256 for k in range(n))

    def handle(self, lg, samples) -> None:
        responses = []
        for r, idx in samples:
            want = self.payload(idx)
            arr = np.zeros(max(len(want), 1), np.uint8)
            if not self.via_callback:
                arr[: len(want)] = np.frombuffer(want, np.uint8)
            self.keep[r] = (arr, want)
            responses.append(lg.QuerySampleResponse(r, arr.ctypes.data if want else 0, len(want)))
        if self.via_callback:
            lg.QuerySamplesComplete(responses, self.callback)
        else:
            lg.QuerySamplesComplete(responses)

    def callback(self, response) -> None:
        self.cb_ids.append(response.id)
        arr, want = self.keep[response.id]
        if want:
            if ctypes.string_at(response.data, response.size) != bytes(len(want)):
                self.cb_seen_zero = False
            arr[: len(want)] = np.frombuffer(want, np.uint8)


@pytest.mark.parametrize("scenario, via_callback", [("SingleStream", True), ("Offline", False),
                                                    ("Server", True)])
def test_accuracy_log_entries(tmp_path, scenario, via_callback):
    total, perf, override = 83, 20, 0 if scenario == "SingleStream" else 57
    responder = ArrayResponder(via_callback)
    ts = make_settings(ours, scenario, "AccuracyOnly", min_duration_ms=50, server_target_qps=5000.0,
                       accuracy_sample_count_override=override, **seed_attrs((11, 22, 33)))
    run = run_test(ours, tmp_path, ts, total=total, perf=perf, handle=responder.handle)
    expected_sets = _core.mlperf_loadable_sets(
        total_sample_count=override or total, qsl_total_count=total, set_size=perf, padding=0, qsl_rng_seed=11)
    assert run.loads == expected_sets
    accuracy_set = {i for s in expected_sets for i in s}
    entries = run.accuracy
    assert len(entries) == len(run.flat) == len(accuracy_set)
    assert {e["qsl_idx"] for e in entries} == accuracy_set
    assert sorted(e["seq_id"] for e in entries) == list(range(len(entries)))
    for e in entries:
        assert e["data"] == ArrayResponder.payload(e["qsl_idx"]).hex().upper(), e
    if via_callback:
        assert sorted(responder.cb_ids) == sorted(r for c in run.ids for r in c)  # once each
        assert responder.cb_seen_zero
    else:
        assert responder.cb_ids == []
    assert run.values("result_validity") == []  # accuracy runs are not judged


@pytest.mark.parametrize("scenario", ["Offline", "Server"])
def test_accuracy_run_waits_for_slow_response_callbacks(tmp_path, scenario):
    """A worker completes one sample per call and its response_cb takes 20 ms (a device
    copy): every response is still logged, none into a closed log, and StartTest only
    returns after the last one was written."""
    responder = ArrayResponder(via_callback=True)
    work: queue.Queue = queue.Queue()
    errors: list = []

    def slow_callback(response):
        time.sleep(0.02)
        responder.callback(response)

    def worker():
        while True:
            samples = work.get()
            if samples is None:
                return
            for r, idx in samples:
                try:
                    want = responder.payload(idx)
                    arr = np.zeros(max(len(want), 1), np.uint8)
                    responder.keep[r] = (arr, want)
                    ours.QuerySamplesComplete(
                        [ours.QuerySampleResponse(r, arr.ctypes.data if want else 0, len(want))], slow_callback)
                except Exception as e:
                    errors.append(repr(e))

    thread = threading.Thread(target=worker, daemon=True)

    def stop():
        work.put(None)
        thread.join(timeout=30)

    ts = make_settings(ours, scenario, "AccuracyOnly", server_target_qps=1000.0, **seed_attrs((1, 1, 1)))
    run = run_test(ours, tmp_path, ts, total=10, perf=5, handle=lambda lg, samples: work.put(samples),
                   start=thread.start, stop=stop)
    assert errors == []
    assert len(responder.cb_ids) == 10
    assert len(run.accuracy) == 10, run.accuracy
    assert {e["qsl_idx"] for e in run.accuracy} == set(range(10))
    for e in run.accuracy:
        assert e["data"] == ArrayResponder.payload(e["qsl_idx"]).hex().upper()
    assert run.wall_s >= 10 * 0.02


def test_submission_run_is_accuracy_then_performance(tmp_path):
    total, perf = 50, 20
    responder = ArrayResponder(via_callback=False)
    ts = make_settings(ours, "SingleStream", "SubmissionRun", min_duration_ms=50, min_query_count=20,
                       single_stream_expected_latency_ns=1_000, **seed_attrs((5, 6, 7)))
    run = run_test(ours, tmp_path, ts, total=total, perf=perf, handle=responder.handle)
    acc_sets = _core.mlperf_loadable_sets(total_sample_count=total, qsl_total_count=total, set_size=perf,
                                          padding=0, qsl_rng_seed=5)
    perf_set = _core.mlperf_loadable_sets(total_sample_count=perf, qsl_total_count=total, set_size=perf,
                                          padding=0, qsl_rng_seed=5)[0]
    qsl_calls = [e for e in run.events if e[0] in ("load", "unload")]
    want = []
    for s in [*acc_sets, perf_set]:
        want += [("load", s), ("unload", s)]
    assert qsl_calls == want
    # Every issue and flush of a run sits between its load and unload.
    flushes = [k for k, e in enumerate(run.events) if e[0] == "flush"]
    assert len(flushes) == len(acc_sets) + 1
    loads = [k for k, e in enumerate(run.events) if e[0] == "load"]
    unloads = [k for k, e in enumerate(run.events) if e[0] == "unload"]
    for lo, fl, un in zip(loads, flushes, unloads):
        assert lo < fl < un
        assert all(run.events[k][0] == "issue" for k in range(lo + 1, fl))
    # Only the accuracy part is logged, then one performance result.
    assert len(run.accuracy) == total
    assert {e["qsl_idx"] for e in run.accuracy} == set(range(total))
    perf_issued = sum(e[1] for e in run.events[loads[-1]:] if e[0] == "issue")
    assert run.one("result_query_count") == perf_issued
    assert run.one("loadgen_samples_issued") == perf_issued
    assert run.validity == "VALID", run.summary


# ============================================================ 6. token latencies


class TimedResponder:
    """A timer thread: first token ``first_s`` after issue, the rest ``total_s`` after."""

    def __init__(self, lg, first_s: float, total_s: float, tokens: int):
        self.lg = lg
        self.first_s = first_s
        self.total_s = total_s
        self.tokens = tokens
        self.heap: list = []
        self.cv = threading.Condition()
        self.done = False
        self.errors: list = []
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.payload = np.arange(4, dtype=np.uint8)

    def handle(self, lg, samples) -> None:
        now = time.perf_counter()
        with self.cv:
            for r, _ in samples:
                heapq.heappush(self.heap, (now + self.first_s, 0, r))
                heapq.heappush(self.heap, (now + self.total_s, 1, r))
            self.cv.notify()

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self.cv:
            self.done = True
            self.cv.notify()
        self.thread.join(timeout=30)

    def _loop(self) -> None:
        ptr = self.payload.ctypes.data
        while True:
            with self.cv:
                while not self.done and (not self.heap or self.heap[0][0] > time.perf_counter()):
                    wait = self.heap[0][0] - time.perf_counter() if self.heap else None
                    self.cv.wait(wait)
                if self.done:
                    return
                _, kind, r = heapq.heappop(self.heap)
            try:
                if kind == 0:
                    self.lg.FirstTokenComplete([self.lg.QuerySampleResponse(r, ptr, 1)])
                else:
                    self.lg.QuerySamplesComplete([self.lg.QuerySampleResponse(r, ptr, 4, self.tokens)])
            except Exception as e:
                self.errors.append(repr(e))


def test_server_token_latencies(tmp_path, no_gc_pauses):
    responder = TimedResponder(ours, first_s=0.002, total_s=0.012, tokens=10)
    ts = make_settings(ours, "Server", min_duration_ms=300, min_query_count=80, server_target_qps=300.0,
                       use_token_latencies=True, ttft_latency=50 * MS, tpot_latency=20 * MS,
                       server_target_latency_ns=100 * MS, server_target_latency_percentile=0.9)
    run = run_test(ours, tmp_path, ts, handle=responder.handle, start=responder.start, stop=responder.stop)
    assert responder.errors == []
    n = len(run.flat)
    assert n >= 80
    ttft50 = run.one("result_first_token_50.00_percentile_latency_ns")
    tpot50 = run.one("result_time_per_output_token_50.00_percentile_ns")
    lat50 = run.one("result_50.00_percentile_latency_ns")
    assert 1.5 * MS <= ttft50 <= 6 * MS, run.summary
    assert 0.8 * MS <= tpot50 <= 2.5 * MS, run.summary
    assert 11 * MS <= lat50 <= 20 * MS, run.summary
    assert run.one("result_first_token_min_latency_ns") >= 2 * MS
    assert run.one("result_time_to_output_token_min") > 0
    # The summary carries the same figures.
    assert run.summary_number("50.00 percentile first token latency (ns)") == ttft50
    assert run.summary_number("50.00 percentile time to output token (ns)") == tpot50
    assert run.summary_number("Completed tokens per second") > 0
    assert run.validity == "VALID", run.summary


# ============================================================ 7. FindPeakPerformance


class CapacitySUT:
    """A server of fixed capacity: one query at a time, ``service_s`` per sample, in
    issue order (a queue in time: each query finishes ``service_s`` per sample after
    the later of its issue and the previous query's finish). A timer thread completes
    each query at that time, so the capacity (~1/service_s samples/s) does not depend
    on how fast Python runs on the test machine, and a run repeated with the same
    schedule sees the same latencies."""

    def __init__(self, lg, service_s: float):
        self.lg = lg
        self.service_s = service_s
        self.due: list = []  # (finish time, samples), finish times increasing
        self.busy_until = 0.0
        self.cv = threading.Condition()
        self.done = False
        self.errors: list = []
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def handle(self, lg, samples) -> None:
        now = time.perf_counter()
        with self.cv:
            self.busy_until = max(now, self.busy_until) + self.service_s * len(samples)
            self.due.append((self.busy_until, samples))
            self.cv.notify()

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self.cv:
            self.done = True
            self.cv.notify()
        self.thread.join(timeout=30)

    def _loop(self) -> None:
        k = 0
        while True:
            with self.cv:
                while not self.done and (k == len(self.due) or self.due[k][0] > time.perf_counter()):
                    self.cv.wait(self.due[k][0] - time.perf_counter() if k < len(self.due) else None)
                if self.done:
                    return
                # Everything due by now, in one call (catching up after a late wake-up).
                now = time.perf_counter()
                ready = []
                while k < len(self.due) and self.due[k][0] <= now:
                    ready += self.due[k][1]
                    k += 1
            try:
                complete_inline(self.lg, ready)
            except Exception as e:
                self.errors.append(repr(e))


FIND_PEAK_BUDGET_S = 120  # the whole search, confirmation included


@pytest.mark.alone
def test_find_peak_performance(tmp_path, restore_options, no_gc_pauses):
    """A SUT of ~1000 queries/s capacity and a 20 ms p99 bound: the search (300 ms
    probes, then full 1 s runs) finds a rate between the lower bound and the capacity,
    confirms it at full length, reports that run, and a fresh run at it holds too.

    A busy host lowers the SUT's capacity from one run to the next (its timer thread wakes
    late), so the confirmation steps down 20% a time (a relative precision of 4%), up to
    six times, and the SUT is slow enough (1 ms a query) that the test's own load is light:
    with 5,000/s and 5% steps, four confirmations all missed on a host with a load of 8."""
    restore_options.peak_probe_min_duration_ms = 300
    restore_options.peak_max_probes = 16
    restore_options.peak_relative_precision = 0.04
    restore_options.peak_max_confirmations = 6
    restore_options.completion_timeout_s = 20  # a stuck run cannot hang the test
    attrs = {"min_duration_ms": 1000, "min_query_count": 100, "server_target_qps": 200.0,
             "server_target_latency_ns": 20 * MS, "server_target_latency_percentile": 0.99}
    sut = CapacitySUT(ours, 1e-3)
    t0 = time.monotonic()
    run = run_test(ours, tmp_path / "peak", make_settings(ours, "Server", "FindPeakPerformance", **attrs),
                   total=1000, perf=200, handle=sut.handle, start=sut.start, stop=sut.stop)
    elapsed = time.monotonic() - t0
    assert sut.errors == []
    assert elapsed < FIND_PEAK_BUDGET_S
    messages = run.messages()
    probes = [m for m in messages if "probe" in m]
    confirmations = [m for m in messages if "full-length run at" in m]
    assert probes and "meets" in probes[0], messages
    assert confirmations and confirmations[-1].endswith("holds"), messages
    found = [m for m in messages if "Found peak performance field" in m]
    assert len(found) == 1, messages
    peak = float(found[0].rsplit(":", 1)[1])
    assert run.validity == "VALID", run.summary
    assert 200 < peak < 1600
    assert run.summary_number("target_qps") == pytest.approx(peak, rel=1e-5)
    scheduled = run.summary_number("Scheduled samples per second")
    assert 200 < scheduled < 1600
    # The full-length confirmation ran at least min_duration: its result is reported.
    assert run.last("result_min_duration_met") is True
    assert run.last("result_query_count") >= peak * 0.9
    # A separate performance run just below the reported rate holds too. Not at it: the
    # peak sits at the SUT's capacity, which a busy machine lowers from one run to the
    # next (a rerun at its capacity missed the bound on a machine with a run queue of ten).
    # Where the first misses (a 1-s run on a busy host can meet a stall), one more at half
    # the answer: on a host with a load of 8 two runs at 0.8x both missed the bound.
    summaries = []
    for attempt, share in enumerate((0.8, 0.5)):
        sut2 = CapacitySUT(ours, 1e-3)
        confirm = run_test(ours, tmp_path / f"confirm{attempt}",
                           make_settings(ours, "Server", "PerformanceOnly",
                                         **{**attrs, "server_target_qps": peak * share}),
                           total=1000, perf=200, handle=sut2.handle, start=sut2.start, stop=sut2.stop)
        summaries.append(confirm.summary)
        if confirm.validity == "VALID":
            break
    assert confirm.validity == "VALID", summaries


def test_find_peak_lower_bound_missed(tmp_path, restore_options):
    """When server_target_qps itself misses the latency bound, the search stops: an
    error line, and one full run at that rate is reported (INVALID)."""
    restore_options.peak_probe_min_duration_ms = 50

    def slow(lg, samples):
        time.sleep(0.002)
        complete_inline(lg, samples)

    ts = make_settings(ours, "Server", "FindPeakPerformance", min_duration_ms=100, min_query_count=10,
                       server_target_qps=200.0, server_target_latency_ns=100_000)
    run = run_test(ours, tmp_path, ts, handle=slow)
    assert any("initial lower bound" in line for line in run.error_lines())
    assert [m for m in run.messages() if "probe" in m] == [
        "FindPeakPerformance: probe 1 at 200.000000 QPS (50 ms): misses the latency bound"]
    assert run.validity == "INVALID"
    assert run.summary_number("target_qps") == 200
    assert len(run.one("loaded_qsl_set")) == 64


# ============================================================ 8. long runs (smoke)


def test_offline_200k_samples(tmp_path):
    def complete_in_chunks(lg, samples):
        for k in range(0, len(samples), 20_000):
            complete_inline(lg, samples[k : k + 20_000])

    ts = make_settings(ours, "Offline", min_duration_ms=50, min_query_count=200_000, offline_expected_qps=1.0)
    run = run_test(ours, tmp_path, ts, total=4096, perf=1024, handle=complete_in_chunks)
    assert len(run.flat) == 200_000
    assert run.one("loadgen_samples_issued") == 200_000
    assert run.one("loadgen_unknown_completions") == 0


def test_single_stream_50k_queries(tmp_path):
    ts = make_settings(ours, "SingleStream", min_duration_ms=50, min_query_count=50_000,
                       single_stream_expected_latency_ns=MS)
    run = run_test(ours, tmp_path, ts, total=1024, perf=256, handle=lambda lg, s: complete_inline(lg, s))
    assert len(run.issued) == 50_000
    assert run.one("result_query_count") == 50_000
    assert run.one("loadgen_unknown_completions") == 0
    assert run.validity == "VALID", run.summary


# ============================================================ 9. ending early


def test_max_query_count_ends_the_run(tmp_path):
    ts = make_settings(ours, "SingleStream", min_duration_ms=50, min_query_count=10, max_query_count=37,
                       single_stream_expected_latency_ns=10_000)
    run = run_test(ours, tmp_path, ts)
    assert len(run.issued) == 37
    assert any("max query count reached" in line for line in run.error_lines())


def test_max_query_count_below_min_query_count_is_invalid(tmp_path):
    ts = make_settings(ours, "SingleStream", min_duration_ms=10, min_query_count=100, max_query_count=50,
                       single_stream_expected_latency_ns=10_000)
    run = run_test(ours, tmp_path, ts)
    assert len(run.issued) == 50
    assert run.validity == "INVALID"
    assert run.one("result_min_queries_met") is False


def test_max_duration_ends_the_run(tmp_path):
    def slow(lg, samples):
        time.sleep(0.001)
        complete_inline(lg, samples)

    ts = make_settings(ours, "SingleStream", min_duration_ms=5000, max_duration_ms=100, min_query_count=10,
                       single_stream_expected_latency_ns=MS)
    run = run_test(ours, tmp_path, ts, handle=slow)
    assert run.wall_s < 2
    assert any("max test duration reached" in line for line in run.error_lines())
    assert run.validity == "INVALID"


def test_server_max_async_queries_ends_a_stuck_run(tmp_path):
    pending: list = []

    def hold(lg, samples):
        pending.extend(samples)

    def flush():  # the SUT completes only when issuing has ended
        complete_inline(ours, pending)

    ts = make_settings(ours, "Server", min_duration_ms=200, min_query_count=50, server_target_qps=1000.0,
                       server_max_async_queries=8)
    run = run_test(ours, tmp_path, ts, handle=hold, flush=flush)
    assert run.wall_s < 2
    assert len(run.issued) == 9  # issuing stops once more than 8 are outstanding
    assert any("too many outstanding" in line for line in run.error_lines())
    assert run.validity == "INVALID"


# ============================================================ the example harness


# ============================================================ regressions of review findings


def _run_core(**kw):
    from loadgen import _core

    args = {"scenario": 2, "accuracy": False, "loaded_samples": [0, 1, 2, 3], "sample_distribution_end": 4,
                "samples_per_query": 1, "target_duration_ns": 0, "min_query_count": 3, "max_query_count": 0,
                "max_duration_ns": 0, "max_async_queries": 0, "target_qps": 1000.0}
    args.update(kw)
    return _core.MlperfRun(**args)


def test_late_completions_of_an_earlier_run_never_match_the_next():
    a, b = _run_core(), _run_core()
    ids_a, ids_b = [], []
    a.issue_all(lambda ids, idx: ids_a.extend(ids), fast=True)
    b.issue_all(lambda ids, idx: ids_b.extend(ids), fast=True)
    assert not set(ids_a) & set(ids_b)
    assert b.complete_ids(ids_a) == len(ids_a)  # all unknown to b
    assert not b.wait_all(0.01)
    assert b.complete_ids(ids_b) == 0 and b.wait_all(1.0)


def test_coalesced_batch_larger_than_the_table_does_not_deadlock():
    """A burst of due queries larger than the tracking table is issued in several
    calls instead of waiting on a query of the batch being built."""
    calls = []
    run = _run_core(target_duration_ns=20_000_000, min_query_count=64, target_qps=200_000.0,
                    coalesce=True, table_capacity=4)

    def issue(ids, idx):
        calls.append(len(ids))
        time.sleep(0.001)
        run.complete_ids(ids)

    stopper = threading.Timer(20.0, run.stop)
    stopper.start()
    try:
        run.issue_all(issue, fast=True)
    finally:
        stopper.cancel()
    counts = run.counts()
    assert not counts["interrupted"]
    assert max(calls) <= 4 and counts["queries_issued"] == run.generated_query_count
    assert run.wait_all(5.0)


def test_fast_sut_with_sampled_accuracy_logging(tmp_path):
    def issue(ids, idx):
        ours.QuerySamplesComplete([ours.QuerySampleResponse(i, 0, 0) for i in ids])

    sut = ours.ConstructFastSUT(issue, lambda: None)
    qsl = ours.ConstructQSL(100, 100, lambda s: None, lambda s: None)
    ts = make_settings(ours, "SingleStream", min_duration_ms=50, min_query_count=40,
                       accuracy_log_probability=0.5)
    try:
        ours.StartTestWithLogSettings(sut, qsl, ts, log_settings(ours, tmp_path))
    finally:
        ours.DestroySUT(sut)
        ours.DestroyQSL(qsl)
    entries = json.loads((tmp_path / "mlperf_log_accuracy.json").read_text())
    assert 0 < len(entries) < 200


def test_completion_from_inside_response_cb(tmp_path):
    """A response_cb that itself completes other samples (re-entrant) loses nothing."""

    def issue(qs):
        first, rest = qs[0], qs[1:]

        def cb(resp):
            if rest:
                ours.QuerySamplesComplete([ours.QuerySampleResponse(s.id, 0, 0) for s in rest])
                rest.clear()

        ours.QuerySamplesComplete([ours.QuerySampleResponse(first.id, 0, 0)], cb)

    sut = ours.ConstructSUT(issue, lambda: None)
    qsl = ours.ConstructQSL(8, 8, lambda s: None, lambda s: None)
    ts = make_settings(ours, "Offline", "AccuracyOnly")
    ours.options.completion_timeout_s = 5.0
    try:
        ours.StartTestWithLogSettings(sut, qsl, ts, log_settings(ours, tmp_path))
    finally:
        ours.options.completion_timeout_s = -1.0
        ours.DestroySUT(sut)
        ours.DestroyQSL(qsl)
    detail = (tmp_path / "mlperf_log_detail.txt").read_text()
    assert "not completed" not in detail and "not in flight" not in detail
    assert len(json.loads((tmp_path / "mlperf_log_accuracy.json").read_text())) == 8


def test_sample_completed_twice_does_not_end_its_query_early():
    run = _run_core(scenario=3, samples_per_query=4, min_query_count=1, target_qps=1.0)
    ids = []
    run.issue_all(lambda i, idx: ids.extend(i), fast=True)
    assert len(ids) == 4
    assert run.complete_ids([ids[0], ids[0], ids[1], ids[2]]) == 1  # the repeat is unknown
    assert not run.wait_all(0.05)  # the fourth sample is still outstanding
    assert run.complete_ids([ids[3]]) == 0 and run.wait_all(1.0)
    counts = run.counts()
    assert (counts["samples_completed"], counts["unknown_completions"], counts["queries_completed"]) == (4, 1, 1)
