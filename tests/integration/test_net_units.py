"""The network clients' parts, without a server: HTTP/1.1 response parsing, Server-Sent
Events, KServe v2 JSON and gRPC tensors, templates, targets, redaction, Prometheus text.

The tests that start processes; the in-process ones are in tests/unit/test_net_units.py."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from loadgen.net.metrics import MetricsScraper


def test_metrics_scraper_reports_counter_deltas_and_gauge_statistics():
    state = {"n": 0}

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            state["n"] += 5
            body = (f"# TYPE hits_total counter\nhits_total {state['n']}\n# TYPE temp gauge\ntemp {state['n']}\n"
                    "# TYPE idle_total counter\nidle_total 4\n").encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        scraper = MetricsScraper(f"http://127.0.0.1:{server.server_port}/metrics", 0.0)
        scraper.check()
        scraper.start()
        scraper.finish()
        report = scraper.report()
    finally:
        server.shutdown()
        server.server_close()
    assert report["scrapes"] == 2 and report["deltas"] == {"hits_total": 5.0}
    assert report["intervals"] == [{"t_s": report["intervals"][0]["t_s"], "deltas": {"hits_total": 5.0},
                                    "gauges": {"temp": 10.0}}]
    assert report["gauges"] == {"temp": {"first": 5.0, "last": 10.0, "min": 5.0, "max": 10.0, "mean": 7.5,
                                         "samples": 2}}
    with pytest.raises(ValueError, match="--server-metrics-url"):
        MetricsScraper("http://127.0.0.1:9/metrics", 0.0, timeout_s=1).check()
