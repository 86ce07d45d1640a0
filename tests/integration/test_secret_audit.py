"""The secret audit: one distinctive secret, planted through each channel a user can pass
one (``--header``, ``--secret-header``, a request template's headers, a URL's user-info
and ``?api_key=``, ``--server-metrics-url``, ``LOADGEN_*`` environment variables, a
``--config`` file, ``--storage-option``, sweep points), must never appear in anything loadgen writes or shows:
result.json, summary.txt, report.html, results.csv, latency.hlog, the per-request records,
``loadgen report`` and ``loadgen merge`` output, sweep files, stdout, stderr, and the live
``/metrics`` page scraped during the run. It must not follow a redirect to another origin
either.

Each case plants the secret through one channel only, so that another channel's redaction
cannot hide a leak. The servers are threads in this process on 127.0.0.1; loadgen runs as
a subprocess, each bounded in time.
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from tests.helpers import _send, _Server
from tests.integration.test_hardening_secrets import cli, cli_env

SECRET = "Vx7Kq2Mz9Rb4Nw6T"  # no three characters of it in a row occur in loadgen's own text
METADATA = {"name": "m", "versions": ["1"], "platform": "test",
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 4]}]}
PAGE = b"# TYPE requests_total counter\nrequests_total 1\n"
RUN = ("--scenario", "constant", "--target-qps", "20", "--duration-s", "1.5", "--max-issue-delay-ms", "500",
       "--grace-s", "5", "--ready-timeout-s", "10", "--interval-s", "0.5")


def _forms(secret: str) -> List[str]:
    """The forms a secret may leak in: itself, and inside basic auth's base64."""
    return [secret, base64.b64encode(f"user:{secret}".encode()).decode()[:-2]]


def _elsewhere(method: str, path: str, head: bytes, sock: socket.socket) -> bool:
    """The other origin a redirect points to: ready, with metadata and a metrics page."""
    if path.startswith("/metrics"):
        return _send(sock, 200, PAGE, content_type="text/plain; version=0.0.4")
    if path.startswith("/v2/models/m") and not path.startswith("/v2/models/m/ready"):
        return _send(sock, 200, json.dumps(METADATA).encode())
    return _send(sock, 200, b"")


def _target(other: _Server):
    """A KServe v2 server whose readiness and metrics redirect (302) to ``other`` and
    whose infer answers 401 with the request's head (line and headers) echoed."""
    def route(method: str, path: str, head: bytes, sock: socket.socket) -> bool:
        bare = path.split("?", 1)[0]
        if bare in ("/v2/health/ready", "/metrics"):
            return _send(sock, 302, b"", (f"Location: http://127.0.0.1:{other.port}{bare}",))
        if bare in ("/v2/models/m/ready", "/v2/models/m"):
            return _send(sock, 200, json.dumps(METADATA).encode() if bare == "/v2/models/m" else b"")
        return _send(sock, 401, json.dumps({"error": head.decode("latin-1")}).encode())
    return route


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_scraping(args: List[str], env: Dict[str, str], port: int) -> Tuple[int, str, str, str]:
    """Runs ``loadgen ARGS`` with --metrics-port ``port``, scraping /metrics while it runs:
    (exit code, stdout, stderr, the last page scraped)."""
    proc = subprocess.Popen([sys.executable, "-m", "loadgen", *args, "--metrics-port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env(env))
    page = ""
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
                if "loadgen_run_info" in text:
                    page = text
                    if "loadgen_queries_failed_total" in text:
                        break
            except OSError:
                pass
            time.sleep(0.1)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"), page


def _files(root: Path) -> List[Tuple[str, str]]:
    """(name, text) of every file under ``root`` and of every path's name."""
    out = []
    for path in sorted(root.rglob("*")):
        out.append((f"the name {path}", str(path.relative_to(root))))
        if path.is_file():
            out.append((str(path), path.read_text(errors="replace")))
    return out


def _assert_clean(texts: List[Tuple[str, str]]) -> None:
    for name, text in texts:
        for form in _forms(SECRET):
            assert form not in text, f"{name} holds the secret"


def _channel(name: str, tmp_path: Path, target: _Server) -> Tuple[List[str], Dict[str, str]]:
    """The flags and environment that plant SECRET through channel ``name``."""
    infer = f"http://127.0.0.1:{target.port}/v2/models/m/infer"
    metrics = f"http://127.0.0.1:{target.port}/metrics"
    sut, args, env = infer, [], {}
    if name == "header":
        args = ["--header", f"Authorization: Bearer {SECRET}"]
    elif name == "secret_header":
        args = ["--secret-header", "X-Tenant-Auth", "--header", f"X-Tenant-Auth: {SECRET}"]
    elif name == "template":
        tpl = tmp_path / "template.json"
        tpl.write_text(json.dumps({"method": "POST", "body": {"inputs": [1, 2, 3, 4]},
                                   "headers": {"Authorization": f"Bearer {SECRET}"}}))
        args = ["--request-template", str(tpl)]
    elif name == "url_userinfo":
        sut = f"http://user:{SECRET}@127.0.0.1:{target.port}/v2/models/m/infer"
    elif name == "url_query":
        sut = f"{infer}?api_key={SECRET}"
    elif name == "metrics_url_userinfo":
        metrics = f"http://user:{SECRET}@127.0.0.1:{target.port}/metrics"
    elif name == "metrics_url_query":
        metrics = f"{metrics}?token={SECRET}"
    elif name == "environment":
        env = {"LOADGEN_HEADER": f"Authorization: Bearer {SECRET}"}
    elif name == "config":
        config = tmp_path / "loadgen.toml"
        config.write_text(f'header = ["Authorization: Bearer {SECRET}"]\n')
        args = ["--config", str(config)]
    elif name == "storage_option":  # recorded with the options, used only for a --output URL
        args = ["--storage-option", f"client_kwargs.aws_secret_access_key={SECRET}"]
    return ["--sut", sut, "--server-metrics-url", metrics, *args], env


CHANNELS = ["header", "secret_header", "template", "url_userinfo", "url_query", "metrics_url_userinfo",
            "metrics_url_query", "environment", "config", "storage_option"]


@pytest.mark.integration
@pytest.mark.parametrize("channel", CHANNELS)
def test_a_secret_passed_through_any_channel_appears_in_no_output(tmp_path, serve, channel):
    other = serve(_elsewhere)
    target = serve(_target(other))
    args, env = _channel(channel, tmp_path, target)
    out_dir, records = tmp_path / "out", tmp_path / "requests.jsonl"
    rc, out, err, page = _run_scraping(["run", *args, *RUN, "--output", str(out_dir),
                                        "--record-requests", str(records)], env, _free_port())
    assert rc == 1, err  # every query failed (401): invalid, and saved
    # The secret went where it was meant to (the SUT, or the metrics endpoint as basic
    # auth; a password in --sut is only redacted, not sent) ...
    if channel not in ("url_userinfo", "storage_option"):
        assert any(SECRET.encode() in h or base64.b64encode(f"user:{SECRET}".encode()) in h for h in target.heads)
    # ... and never on to another origin by a redirect (readiness, metrics scrapes).
    assert other.heads, "the redirects were not followed"
    _assert_clean([(f"the request to the other origin {h[:60]!r}", h.decode("latin-1")) for h in other.heads])
    doc = json.loads((out_dir / "result.json").read_text())
    assert doc["counts"]["failed"] >= 1 and doc["server_metrics"]["scrapes"] >= 1, doc["server_metrics"]
    assert "loadgen_run_info" in page, f"/metrics was never scraped during the run\n{err}"
    texts = [("stdout", out), ("stderr", err), ("/metrics", page), (str(records), records.read_text()),
             *_files(out_dir)]
    assert {"result.json", "summary.txt", "report.html", "results.csv", "latency.hlog"} <= {
        p.name for p in out_dir.iterdir()}
    # What reads the results back: report (text and HTML), merge.
    rc, out, err = cli("report", out_dir / "result.json")
    assert rc in (0, 1), err
    texts += [("report stdout", out), ("report stderr", err)]
    html = tmp_path / "again.html"
    rc, out, err = cli("report", "--html", html, out_dir)
    assert rc in (0, 1) and html.is_file(), err  # 1: the results are invalid
    texts += [("report --html", html.read_text()), ("report --html output", out + err)]
    merged = tmp_path / "merged"
    rc, out, err = cli("merge", out_dir, "--output", merged)
    assert rc in (0, 1) and (merged / "result.json").is_file(), err
    texts += [("merge output", out + err), *_files(merged)]
    _assert_clean(texts)


@pytest.mark.integration
@pytest.mark.parametrize("where", ["vary", "config", "points_file"])
def test_a_secret_in_sweep_points_appears_in_no_sweep_output(tmp_path, serve, where):
    other = serve(_elsewhere)
    target = serve(_target(other))
    values = [f"Authorization: Bearer {SECRET}", f"X-Api-Key: {SECRET}"]
    args: List[str] = []
    if where == "vary":
        args = ["--vary", "header=" + ",".join(values)]
    elif where == "config":
        config = tmp_path / "loadgen.toml"
        config.write_text("[sweep]\npoints = [" + ", ".join(f'{{header = ["{v}"]}}' for v in values) + "]\n")
        args = ["--config", str(config)]
    else:
        points = tmp_path / "points.json"
        points.write_text(json.dumps([{"header": [v]} for v in values]))
        args = ["--points", str(points)]
    out_dir = tmp_path / "sweep"
    rc, out, err, page = _run_scraping(
        ["sweep", "--sut", f"http://127.0.0.1:{target.port}/v2/models/m/infer", *RUN, "--duration-s", "1",
         *args, "--output", str(out_dir), "--record-requests", "requests.jsonl"], {}, _free_port())
    assert rc == 1, err
    assert sum(SECRET.encode() in h for h in target.heads) >= 2  # both points sent it
    _assert_clean([(f"the request to the other origin {h[:60]!r}", h.decode("latin-1")) for h in other.heads])
    assert (out_dir / "sweep.json").is_file() and (out_dir / "sweep.csv").is_file()
    assert len(list((out_dir / "points").glob("*/result.json"))) == 2
    assert "loadgen_run_info" in page, f"/metrics was never scraped during the sweep\n{err}"
    texts = [("stdout", out), ("stderr", err), ("/metrics", page), *_files(out_dir)]
    html = tmp_path / "sweep.html"
    rc, out, err = cli("report", "--html", html, out_dir)
    assert rc in (0, 1) and html.is_file(), err  # 1: the results are invalid
    texts += [("report --html", html.read_text()), ("report --html output", out + err)]
    merged = tmp_path / "merged"
    rc, out, err = cli("merge", out_dir, "--output", merged)
    assert rc in (0, 1), err
    texts += [("merge output", out + err), *_files(merged)]
    _assert_clean(texts)
