"""``--server-metrics-url``: gauges and counters through the whole scraper (HTTP, the
prometheus_client parsers, the tally, the report), against a small page server on
127.0.0.1 that serves a list of pages in turn, and against a real Triton."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator, List, Sequence, Tuple

import pytest

from loadgen.cli import main
from loadgen.net.metrics import MetricsScraper, parse_prometheus, series_key
from loadgen.results.files import load_result
from loadgen.results.render import render_summary
from tests.servers.procs import require_servers
from tests.servers.triton import INSTALL_HINT, find_triton, start_triton

PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
UUID = "GPU-5f3c2a1e-8b4d-4c6e-9a7f-0e1d2c3b4a59"


def triton_gpu_page(util: float, power: float, used: float, success: int) -> str:
    """A Triton metrics page as Triton writes it with one GPU (DCGM gauges and the
    per-model counters)."""
    return f"""# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{{model="resnet",version="1"}} {success}
# HELP nv_inference_count Number of inferences performed (does not include cached requests)
# TYPE nv_inference_count counter
nv_inference_count{{model="resnet",version="1"}} {success * 8}
# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting execution per-model.
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{{model="resnet",version="1"}} 0
# HELP nv_energy_consumption GPU energy consumption in joules since the Triton Server started
# TYPE nv_energy_consumption counter
nv_energy_consumption{{gpu_uuid="{UUID}"}} {1000 + success}
# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{{gpu_uuid="{UUID}"}} {util}
# HELP nv_gpu_memory_total_bytes GPU total memory, in bytes
# TYPE nv_gpu_memory_total_bytes gauge
nv_gpu_memory_total_bytes{{gpu_uuid="{UUID}"}} 85899345920
# HELP nv_gpu_memory_used_bytes GPU used memory, in bytes
# TYPE nv_gpu_memory_used_bytes gauge
nv_gpu_memory_used_bytes{{gpu_uuid="{UUID}"}} {used}
# HELP nv_gpu_power_usage GPU power usage in watts
# TYPE nv_gpu_power_usage gauge
nv_gpu_power_usage{{gpu_uuid="{UUID}"}} {power}
# HELP nv_gpu_power_limit GPU power management limit in watts
# TYPE nv_gpu_power_limit gauge
nv_gpu_power_limit{{gpu_uuid="{UUID}"}} 700
"""


TRITON_PAGES = [triton_gpu_page(0.0, 70.5, 1.0e9, 0), triton_gpu_page(0.75, 410.25, 6.5e9, 120),
                triton_gpu_page(0.9, 655.0, 7.0e9, 260), triton_gpu_page(0.5, 300.0, 7.0e9, 300)]


class PageServer:
    """Serves ``pages`` [(content type, text)] on GET, one per request in turn (the last
    again once they run out); ``served`` counts the requests answered."""

    def __init__(self, pages: Sequence[Tuple[str, str]]) -> None:
        self.pages = list(pages)
        self.served = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                content_type, text = owner.pages[min(owner.served, len(owner.pages) - 1)]
                owner.served += 1
                body = text.encode()
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/metrics"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture
def serve() -> Iterator:
    servers: List[PageServer] = []

    def start(pages: Sequence[Tuple[str, str]]) -> PageServer:
        servers.append(PageServer(pages))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def scrape(pages: Sequence[Tuple[str, str]], serve, max_series: int = 5000) -> dict:
    """The report of one scrape per page (interval scrapes driven by hand: no timing)."""
    server = serve(pages)
    scraper = MetricsScraper(server.url, 0.0, max_series=max_series)
    scraper.check()
    for _ in pages[1:-1]:
        scraper._scrape()
    scraper.finish()
    assert server.served == len(pages)
    return scraper.report()


def gpu(name: str) -> str:
    return f'{name}{{gpu_uuid="{UUID}"}}'


# ------------------------------------------------------------------ Triton GPU page

def test_triton_gpu_gauges_keep_first_last_min_max_mean_and_per_interval_values(serve):
    report = scrape([(PROMETHEUS, p) for p in TRITON_PAGES], serve)
    assert report["scrapes"] == 4 and report["failed_scrapes"] == 0 and report["errors"] == []
    g = report["gauges"]
    assert g[gpu("nv_gpu_utilization")] == {"first": 0.0, "last": 0.5, "min": 0.0, "max": 0.9,
                                            "mean": pytest.approx((0.75 + 0.9 + 0.5) / 4), "samples": 4}
    assert g[gpu("nv_gpu_power_usage")] == {"first": 70.5, "last": 300.0, "min": 70.5, "max": 655.0,
                                            "mean": pytest.approx((70.5 + 410.25 + 655 + 300) / 4), "samples": 4}
    assert g[gpu("nv_gpu_memory_used_bytes")]["max"] == 7.0e9
    assert g[gpu("nv_gpu_memory_total_bytes")]["min"] == g[gpu("nv_gpu_memory_total_bytes")]["max"] == 85899345920
    # Counters stay deltas, keyed by the name the server wrote (no _total added).
    assert report["deltas"] == {'nv_inference_request_success{model="resnet",version="1"}': 300,
                                'nv_inference_count{model="resnet",version="1"}': 2400,
                                gpu("nv_energy_consumption"): 300}
    assert report["before"][gpu("nv_energy_consumption")] == 1000
    assert not set(report["deltas"]) & set(g)
    assert [i["gauges"][gpu("nv_gpu_utilization")] for i in report["intervals"]] == [0.75, 0.9, 0.5]
    assert [i["deltas"].get('nv_inference_request_success{model="resnet",version="1"}') for i in
            report["intervals"]] == [120, 140, 40]
    assert report["series"] == 9 and report["dropped_series"] == 0 and report["non_finite_values"] == 0


def test_a_run_keeps_the_servers_gauges_in_the_saved_result_and_the_summary(serve, tmp_path):
    # The whole path: loadgen run as a process, scraping every 0.1 s during a 0.6 s run.
    # The first page answers the check before the run (a scrape of its own).
    server = serve([(PROMETHEUS, p) for p in TRITON_PAGES[:1] + TRITON_PAGES])
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "loadgen", "run", "--sut", "demo", "--scenario", "constant",
                           "--target-qps", "200", "--duration-s", "0.6", "--interval-s", "0.1",
                           "--max-issue-delay-ms", "100", "--server-metrics-url", server.url, "--output", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode in (0, 1), proc.stderr
    doc = load_result(str(out / "result.json"))  # checked against the schema as it is read
    sm = doc["server_metrics"]
    n = sm["scrapes"]
    assert n == server.served - 1 and 4 <= n, sm  # before, every 0.1 s, after
    served = [0.0, 0.75, 0.9] + [0.5] * (n - 3)
    util = sm["gauges"][gpu("nv_gpu_utilization")]
    assert util == {"first": 0.0, "last": 0.5, "min": 0.0, "max": 0.9, "mean": pytest.approx(sum(served) / n),
                    "samples": n}
    assert len(sm["intervals"]) == n - 1
    assert [i["gauges"][gpu("nv_gpu_utilization")] for i in sm["intervals"]] == served[1:]
    assert sm["deltas"]['nv_inference_request_success{model="resnet",version="1"}'] == 300
    summary = render_summary(doc)
    assert f"{gpu('nv_gpu_memory_total_bytes')} mean 8.59e+10" in summary, summary
    assert "nv_inference_request_success" in summary and f"({n} scrapes, 0 failed)" in summary


# ------------------------------------------------------------------ series keys

def test_label_order_does_not_matter_and_values_are_escaped(serve):
    value = 'a b "q" C:\\dir # not a comment'
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    pages = [(PROMETHEUS, f'# TYPE req_total counter\nreq_total{{path="{escaped}",code="200"}} 5\n'
                          f'# TYPE q gauge\nq{{b="2",a="1"}} 1\n'),
             (PROMETHEUS, f'# TYPE req_total counter\nreq_total{{code="200",path="{escaped}"}} 9\n'
                          f'# TYPE q gauge\nq{{a="1",b="2"}} 3\n')]
    report = scrape(pages, serve)
    key = series_key("req_total", {"path": value, "code": "200"})
    assert key == f'req_total{{code="200",path="{escaped}"}}'
    assert report["deltas"] == {key: 4}
    assert report["gauges"] == {'q{a="1",b="2"}': {"first": 1, "last": 3, "min": 1, "max": 3, "mean": 2,
                                                   "samples": 2}}
    assert report["series"] == 2
    # The key reads back as the same series.
    values, _ = parse_prometheus(f"{key} 1\n")
    assert list(values) == [key]


def test_an_exemplar_is_not_part_of_the_value_with_or_without_labels(serve):
    page = ('v{path="/a b"} 2 # {trace_id="abc"} 1.0\n'
            'w 7 # {trace_id="def"} 0.5 1700000000.1\n'
            '# TYPE hits_total counter\nhits_total{x="# {y} 1"} 4 # {trace_id="g h"} 1\n')
    values, kinds = parse_prometheus(page)
    assert values == {'v{path="/a b"}': 2, "w": 7, 'hits_total{x="# {y} 1"}': 4}
    assert kinds == {'v{path="/a b"}': "gauge", "w": "gauge", 'hits_total{x="# {y} 1"}': "counter"}
    report = scrape([(PROMETHEUS, page), (PROMETHEUS, page.replace("} 4 #", "} 6 #"))], serve)
    assert report["deltas"] == {'hits_total{x="# {y} 1"}': 2}
    assert report["gauges"]['v{path="/a b"}']["last"] == 2


def test_openmetrics_is_parsed_as_openmetrics_when_the_server_says_so(serve):
    page = ('# TYPE req counter\nreq_total{code="200"} {n} # {trace_id="abc"} 1.0 1700000000.5\n'
            'req_created{code="200"} 1700000000.0\n'
            '# TYPE lat histogram\nlat_bucket{le="0.1"} {n} # {trace_id="x"} 0.05\nlat_bucket{le="+Inf"} {n}\n'
            'lat_count {n}\nlat_sum 0.5\nlat_created 1700000000.0\n'
            '# TYPE build info\nbuild_info{version="1.2"} 1\n# TYPE up gauge\nup 1\n# EOF\n')
    report = scrape([(OPENMETRICS, page.replace("{n}", "3")), (OPENMETRICS, page.replace("{n}", "5"))], serve)
    assert report["failed_scrapes"] == 0, report["errors"]
    assert report["deltas"] == {'lat_bucket{le="+Inf"}': 2, 'lat_bucket{le="0.1"}': 2, "lat_count": 2,
                                'req_total{code="200"}': 2}
    assert sorted(report["gauges"]) == ['build_info{version="1.2"}', "up"]  # no _created time stamps


def test_openmetrics_without_its_eof_or_with_an_exemplar_on_a_gauge_is_a_failed_scrape(serve):
    good = "# TYPE up gauge\nup 1\n# EOF\n"
    server = serve([(OPENMETRICS, good), (OPENMETRICS, "# TYPE up gauge\nup 1\n"),
                    (OPENMETRICS, '# TYPE up gauge\nup 1 # {trace_id="a"} 1\n# EOF\n'), (OPENMETRICS, good)])
    scraper = MetricsScraper(server.url, 0.0)
    scraper.check()
    scraper._scrape()
    scraper._scrape()
    scraper.finish()
    report = scraper.report()
    assert report["scrapes"] == 2 and report["failed_scrapes"] == 2
    assert "not OpenMetrics text" in report["errors"][0] and "EOF" in report["errors"][0]
    assert "exemplar" in report["errors"][1]


# ------------------------------------------------------------------ bad pages

def test_a_page_that_does_not_parse_is_an_error_entry_and_the_scrapes_go_on(serve):
    good = "# TYPE g gauge\ng {v}\n# TYPE c_total counter\nc_total {v}\n"
    report = scrape([(PROMETHEUS, good.format(v=1)), (PROMETHEUS, "<html><body>Not Found</body></html>\n"),
                     (PROMETHEUS, 'g{a="unterminated} 1\n'), (PROMETHEUS, good.format(v=4))], serve)
    assert report["scrapes"] == 2 and report["failed_scrapes"] == 2
    assert len(report["errors"]) == 2 and all("not Prometheus text" in e for e in report["errors"])
    assert report["deltas"] == {"c_total": 3} and report["gauges"]["g"]["samples"] == 2
    assert [i["gauges"] for i in report["intervals"]] == [{"g": 4}]


def test_a_page_that_does_not_parse_before_the_run_is_a_usage_error(serve, capsys):
    server = serve([(PROMETHEUS, "<html>\n")])
    rc = main(["run", "--sut", "null", "--duration-s", "0.1", "--server-metrics-url", server.url])
    err = capsys.readouterr().err
    assert rc == 2 and "--server-metrics-url" in err and "not Prometheus text" in err, err


def test_nan_and_infinite_values_are_left_out_and_counted(serve):
    pages = [(PROMETHEUS, "# TYPE g gauge\ng NaN\n# TYPE h gauge\nh 1\n# TYPE c_total counter\nc_total 1\n"),
             (PROMETHEUS, "# TYPE g gauge\ng 2\n# TYPE h gauge\nh +Inf\n# TYPE c_total counter\nc_total +Inf\n"),
             (PROMETHEUS, "# TYPE g gauge\ng -Inf\n# TYPE h gauge\nh 3\n# TYPE c_total counter\nc_total 4\n")]
    report = scrape(pages, serve)
    assert report["non_finite_values"] == 4
    assert report["gauges"] == {"g": {"first": 2, "last": 2, "min": 2, "max": 2, "mean": 2, "samples": 1},
                                "h": {"first": 1, "last": 3, "min": 1, "max": 3, "mean": 2, "samples": 2}}
    assert report["deltas"] == {"c_total": 3}
    assert [i["gauges"] for i in report["intervals"]] == [{"g": 2}, {"h": 3}]
    json.dumps(report, allow_nan=False)  # a result document cannot hold NaN


def test_series_past_the_limit_are_counted_not_kept(serve):
    def page(n: int) -> str:
        return "# TYPE g gauge\n" + "".join(f'g{{i="{i}"}} {i}\n' for i in range(n))

    report = scrape([(PROMETHEUS, page(8)), (PROMETHEUS, page(25))], serve, max_series=10)
    assert report["series"] == 10 and report["dropped_series"] == 15
    assert sorted(report["gauges"]) == sorted(f'g{{i="{i}"}}' for i in range(10))
    assert "more than 10 series" in report["notes"][0]
    assert all(len(i["gauges"]) <= 10 for i in report["intervals"])


def test_a_missing_prometheus_client_says_what_to_install(serve, capsys, monkeypatch):
    server = serve([(PROMETHEUS, "up 1\n")])
    for name in ("prometheus_client", "prometheus_client.parser", "prometheus_client.openmetrics.parser"):
        monkeypatch.setitem(sys.modules, name, None)  # as if it were not installed: import fails
    rc = main(["run", "--sut", "null", "--duration-s", "0.1", "--server-metrics-url", server.url])
    err = capsys.readouterr().err
    assert rc == 2 and "pip install 'prometheus-client>=0.17'" in err and "--server-metrics-url" in err, err
    assert server.served == 0


# ------------------------------------------------------------------ a real Triton

@pytest.fixture(scope="module")
def triton(tmp_path_factory):
    if find_triton() is None:
        if require_servers():
            pytest.fail(f"Triton is not installed: {INSTALL_HINT}")
        pytest.skip(f"Triton is not installed: {INSTALL_HINT}")
    server = start_triton(str(tmp_path_factory.mktemp("triton")))
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.integration
def test_tritons_own_gauges_come_through_without_nvml_on_the_client(triton):
    proc = subprocess.run([sys.executable, "-m", "loadgen", "run", "--json",
                           "--sut", f"{triton.http_url}/v2/models/add_one/infer", "--scenario", "concurrency",
                           "--concurrency", "4", "--duration-s", "1", "--interval-s", "0.25",
                           "--max-issue-delay-ms", "100", "--server-metrics-url", triton.metrics_url],
                          capture_output=True, text=True, timeout=90)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    sm = doc["server_metrics"]
    n = sm["scrapes"]
    assert sm["failed_scrapes"] == 0 and n >= 4, sm
    for name in ("nv_cpu_utilization", "nv_cpu_memory_used_bytes", "nv_pinned_memory_pool_total_bytes",
                 'nv_inference_pending_request_count{model="add_one",version="1"}'):
        g = sm["gauges"][name]
        assert set(g) == {"first", "last", "min", "max", "mean", "samples"} and g["samples"] == n, (name, g)
        assert g["min"] <= g["mean"] <= g["max"] and g["min"] <= min(g["first"], g["last"]), (name, g)
        assert all(math.isfinite(i["gauges"][name]) for i in sm["intervals"]), name
    assert len(sm["intervals"]) == n - 1
    assert sm["deltas"]['nv_inference_request_success{model="add_one",version="1"}'] == doc["counts"]["completed"]
    assert not any(k.startswith("nv_gpu_") for k in sm["gauges"])  # Triton runs with --allow-gpu-metrics=false
