"""Live Prometheus metrics during a run (--metrics-port, loadgen/telemetry/live.py): scraped
while `loadgen run` runs (and lingers), in a sweep, in process with scripted GPUs, and by a
real Prometheus server that answers a PromQL query with the run's count."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadgen.engine import Engine
from loadgen.engine.settings import EngineSettings
from loadgen.options import resolve
from loadgen.results import load_result
from loadgen.runner import prepare, run_benchmark
from loadgen.telemetry import FakeBackend, FakeDevice, GpuSampler
from loadgen.telemetry.live import LiveMetrics, label_names, target_qps_at
from tests.servers.procs import free_port, http_get
from tests.servers.prometheus import Prometheus, running_prometheus, wait_until
from tests.helpers import clean_env, run_cli

Labels = Tuple[Tuple[str, str], ...]
Scrape = Dict[str, Dict[Labels, float]]


def parse(text: str) -> Scrape:
    """Sample name -> {sorted labels: value}, through prometheus_client's own parser."""
    out: Scrape = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def one(scrape: Scrape, name: str) -> float:
    [value] = scrape[name].values()
    return value


def scrape(port: int) -> Scrape:
    status, body = http_get(f"http://127.0.0.1:{port}/metrics", 1.0)
    return parse(body.decode()) if status == 200 else {}


def start_cli(tmp_path: Path, *args: object) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "loadgen", *map(str, args)], cwd=tmp_path, env=clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def scrape_while_running(proc: subprocess.Popen, port: int, timeout_s: float = 30.0) -> List[Scrape]:
    """Every answered scrape, every 0.1 s, until the process ends (bounded)."""
    scrapes = []
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        got = scrape(port)
        if got:
            scrapes.append(got)
        time.sleep(0.1)
    return scrapes


def finish(proc: subprocess.Popen) -> Tuple[str, str]:
    try:
        return proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.integration
def test_a_run_is_scraped_while_it_runs_and_lingers_with_the_counts_of_its_result(tmp_path):
    port = free_port()
    proc = start_cli(tmp_path, "run", "--scenario", "constant", "--target-qps", 400, "--duration-s", 1.5,
                     "--interval-s", 0.5, "--sut", "demo", "--metrics-port", port, "--metrics-linger-s", 1.5,
                     "--label", "team=a.b", "--label", "gpu=h100", "--label", "model-name=m", "--output", "out")
    scrapes = scrape_while_running(proc, port)
    out, err = finish(proc)
    assert proc.returncode in (0, 1), err  # valid or not (a busy machine), it ran and saved its result
    doc = load_result(tmp_path / "out" / "result.json")
    assert http_get(f"http://127.0.0.1:{port}/metrics", 1.0)[0] == 0  # the server ended with the command
    assert f"live metrics on http://127.0.0.1:{port}/metrics" in out
    assert "serving the final metrics" in out and "for 1.5 s more" in out
    running = [s for s in scrapes if one(s, "loadgen_running") == 1.0]
    lingering = [s for s in scrapes if one(s, "loadgen_running") == 0.0]
    assert len(running) >= 5 and len(lingering) >= 5, (len(running), len(lingering))
    completed = [one(s, "loadgen_queries_completed_total") for s in running]
    assert completed == sorted(completed) and len(set(completed)) >= 3, completed  # it rose
    counts = doc["counts"]
    for s in lingering:  # the final values: the result's
        for key in ("issued", "completed", "failed", "timed_out", "cancelled"):
            assert one(s, f"loadgen_queries_{key}_total") == counts[key], key
        assert one(s, "loadgen_queries_in_flight") == 0
    # Labels: the run's labels (made Prometheus names), the worker index and the run id.
    [labels] = lingering[-1]["loadgen_queries_completed_total"]
    assert dict(labels) == {"team": "a.b", "label_gpu": "h100", "model_name": "m", "worker": "0",
                            "run": doc["live_metrics"]["run"]}
    assert doc["live_metrics"] == {"addr": "127.0.0.1", "port": port, "run": doc["live_metrics"]["run"]}
    [info] = lingering[-1]["loadgen_run_info"]
    assert dict(info)["scenario"] == "constant" and dict(info)["sut"] == "demo" and dict(info)["mode"] == "constant"
    mid = running[len(running) // 2]
    assert one(mid, "loadgen_target_queries_per_second") == 400.0
    assert 200 < one(mid, "loadgen_achieved_queries_per_second") < 600
    quantiles = {dict(k)["quantile"]: v for k, v in mid["loadgen_latency_seconds"].items()}
    assert set(quantiles) == {"0.5", "0.9", "0.99", "1"}
    assert 0 < quantiles["0.5"] <= quantiles["0.9"] <= quantiles["0.99"] <= quantiles["1"]
    delay = {dict(k)["quantile"] for k in mid["loadgen_issue_delay_seconds"]}
    assert delay == {"0.5", "0.99", "1"}  # the interval's issue delay (no p90 is cut for it)
    assert "loadgen_ttft_seconds" not in mid  # no first tokens: no TTFT family
    run_q = {dict(k)["quantile"] for k in lingering[-1]["loadgen_run_issue_delay_seconds"]}
    assert run_q == {"0.5", "0.9", "0.99", "1"}


@pytest.mark.integration
def test_a_port_in_use_or_a_bad_address_is_a_usage_error_before_the_run(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_cli("run", "--sut", "demo", "--duration-s", 5, "--metrics-port", port, "--output", "out",
                       cwd=tmp_path, timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert f"cannot serve live metrics on 127.0.0.1:{port}: Address already in use" in proc.stderr
    assert not (tmp_path / "out" / "result.json").exists()
    proc = run_cli("run", "--sut", "demo", "--metrics-port", 1, "--metrics-addr", "no-such-host.invalid",
                   cwd=tmp_path, timeout=30)
    assert proc.returncode == 2 and "no-such-host.invalid:1" in proc.stderr, proc.stderr
    proc = run_cli("run", "--sut", "demo", "--metrics-linger-s", 3, cwd=tmp_path, timeout=30)
    assert proc.returncode == 2 and "--metrics-linger-s needs --metrics-port" in proc.stderr, proc.stderr
    proc = run_cli("run", "--sut", "demo", "--metrics-port", 70000, cwd=tmp_path, timeout=30)
    assert proc.returncode == 2 and "--metrics-port" in proc.stderr and "65535" in proc.stderr, proc.stderr


@pytest.mark.integration
def test_port_0_picks_a_free_port_and_says_which(tmp_path):
    proc = run_cli("run", "--json", "--sut", "demo", "--duration-s", 0.3, "--metrics-port", 0, cwd=tmp_path,
                   timeout=30)
    assert proc.returncode in (0, 1), proc.stderr  # a short run may be invalid; it ran
    port = json.loads(proc.stdout)["live_metrics"]["port"]
    assert port > 0 and f"live metrics on http://127.0.0.1:{port}/metrics" in proc.stderr  # --json: on stderr


@pytest.mark.integration
def test_ctrl_c_ends_the_linger_at_once_and_the_run_keeps_its_exit_code(tmp_path):
    proc = start_cli(tmp_path, "run", "--sut", "demo", "--duration-s", 0.3, "--metrics-port", 0,
                     "--metrics-linger-s", 60, "--output", "out")
    try:
        assert proc.stdout is not None
        lines = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if not line or line.startswith("serving the final metrics"):
                break
        assert lines[-1].startswith("serving the final metrics"), lines
        port = int(lines[0].split(":")[2].split("/")[0])
        assert one(scrape(port), "loadgen_running") == 0.0
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(10)
        assert time.monotonic() - started < 3
    finally:
        out, err = finish(proc)
    assert proc.returncode in (0, 1), err  # the run's verdict (a short run may be invalid), not 130
    assert (tmp_path / "out" / "result.json").exists()


@pytest.mark.integration
def test_a_sweep_serves_every_point_on_one_server_labelled_with_its_key(tmp_path):
    port = free_port()
    proc = start_cli(tmp_path, "sweep", "--sut", "demo", "--scenario", "constant", "--duration-s", 0.4,
                     "--vary", "target_qps=100,300", "--output", "sw", "--metrics-port", port,
                     "--metrics-linger-s", 1)
    scrapes = scrape_while_running(proc, port)
    out, err = finish(proc)
    assert proc.returncode in (0, 1), err
    docs = [load_result(p) for p in sorted((tmp_path / "sw" / "points").glob("*/result.json"))]
    keys = {d["sweep"]["key"]: d for d in docs}
    assert {d["live_metrics"]["port"] for d in docs} == {port}
    seen = {}
    for s in scrapes:
        for labels, value in s.get("loadgen_target_queries_per_second", {}).items():
            seen[dict(labels)["point"]] = value
    assert seen == {k: d["settings"]["effective"]["target_qps"] for k, d in keys.items()}
    last = scrapes[-1]
    [labels] = last["loadgen_queries_completed_total"]
    point = dict(labels)["point"]
    assert one(last, "loadgen_queries_completed_total") == keys[point]["counts"]["completed"]


def test_in_process_runs_serve_failures_by_kind_and_the_scripted_gpus(tmp_path):
    def sut(sample_index: int) -> None:
        if sample_index % 2:
            raise KeyError("odd")
    options, _ = resolve({"scenario": "constant", "target_qps": 500, "duration_s": 0.4, "sut": "null",
                          "metrics_port": 0, "max_error_rate": 1, "label": ["worker=x"]}, {})
    _, effective, settings, _ = prepare(options)
    gpus = GpuSampler("all", 10, backend=FakeBackend([FakeDevice("GPU-a", utilization_pct=(75,), power_w=250,
                                                                 memory_used=(2 ** 30,), temperature_c=(55,))]))
    with LiveMetrics.serve(options) as live:
        engine = Engine(settings, sut)
        live.attach(engine, effective, settings, sut, gpus)
        gpus.start()
        time.sleep(1.2)  # the driver's buffers are drained once a second
        engine.start()
        assert engine.wait(10)
        live.finish()
        gpus.stop()
        got = scrape(live.port)
    c = engine.counts()
    assert one(got, "loadgen_queries_failed_total") == c["failed"] > 0
    [(labels, value)] = got["loadgen_errors_total"].items()
    assert dict(labels)["kind"] == "KeyError" and value == c["failed"]
    assert dict(labels)["label_worker"] == "x" and dict(labels)["worker"] == "0"
    gpu = {name: v for name, series in got.items() if name.startswith("loadgen_gpu_")
           for labels, v in series.items() if dict(labels)["uuid"] == "GPU-a" and dict(labels)["gpu"] == "0"}
    assert gpu == {"loadgen_gpu_utilization_ratio": 0.75, "loadgen_gpu_power_watts": 250.0,
                   "loadgen_gpu_memory_used_bytes": 2.0 ** 30, "loadgen_gpu_temperature_celsius": 55.0,
                   "loadgen_gpu_sm_clock_hertz": 1980e6}
    assert http_get(f"http://127.0.0.1:{live.port}/metrics", 1.0)[0] == 0


def test_run_benchmark_alone_serves_and_lingers_with_metrics_port():
    port = free_port()
    options, _ = resolve({"scenario": "poisson", "target_qps": 300, "duration_s": 0.3, "sut": "demo",
                          "metrics_port": port, "metrics_linger_s": 5}, {})
    started = time.monotonic()
    # Asked to stop after the run: the linger ends then, long before its 5 s.
    doc = run_benchmark(options, stop_requested=lambda: time.monotonic() - started > 2.0)
    assert time.monotonic() - started < 4
    assert doc["live_metrics"]["port"] == port and not doc["interrupted"]
    assert http_get(f"http://127.0.0.1:{port}/metrics", 1.0)[0] == 0


def test_the_target_rate_follows_the_stages_and_labels_become_prometheus_names():
    ramp = EngineSettings(mode="stages", stages=[(2.0, 0.0, 100.0), (1.0, 50.0, 50.0)])
    assert [target_qps_at(ramp, t) for t in (0.0, 1.0, 2.5, 3.5)] == [0.0, 50.0, 50.0, 0.0]
    assert target_qps_at(EngineSettings(mode="poisson", target_qps=7.0), 1.0) == 7.0
    assert target_qps_at(EngineSettings(mode="closed"), 1.0) is None
    assert label_names({"a.b-c": "1", "quantile": "2", "__x": "3", "run": "r"}) == {
        "a_b_c": "1", "label_quantile": "2", "label___x": "3", "run": "r"}


@pytest.fixture
def prometheus_and_port(tmp_path) -> Iterator[Tuple[Prometheus, int]]:
    port = free_port()
    yield from ((p, port) for p in running_prometheus(str(tmp_path), [f"127.0.0.1:{port}"]))


@pytest.mark.integration
def test_a_real_prometheus_scrapes_the_run_and_answers_with_its_count(tmp_path, prometheus_and_port):
    prometheus, port = prometheus_and_port
    run_id = f"t{time.time_ns()}"
    proc = run_cli("run", "--scenario", "constant", "--target-qps", 500, "--query-count", 777, "--sut", "demo",
                   "--metrics-port", port, "--metrics-linger-s", 3, "--label", f"run={run_id}", "--output", "out",
                   cwd=tmp_path, timeout=60)
    assert proc.returncode in (0, 1), proc.stderr
    doc = load_result(tmp_path / "out" / "result.json")
    assert doc["counts"]["completed"] == 777 and doc["live_metrics"]["run"] == run_id
    query = f'max_over_time(loadgen_queries_completed_total{{run="{run_id}",worker="0"}}[1m])'
    result = wait_until(lambda: prometheus.query(query), 5.0)
    assert len(result) == 1, (result, prometheus.query("loadgen_running"), prometheus.targets(),
                              prometheus.process.log_tail())
    assert float(result[0]["value"][1]) == 777
    issued = prometheus.query(f'max_over_time(loadgen_queries_issued_total{{run="{run_id}"}}[1m])')
    assert float(issued[0]["value"][1]) == doc["counts"]["issued"]
