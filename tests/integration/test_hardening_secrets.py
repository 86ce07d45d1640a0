"""Secrets against a hostile user, second pass: credentials passed to a sweep, a request
template's headers, secret-named URL query values (``?api_key=``), malformed
``--header`` values, live ``/metrics`` labels; and request templates whose fields are
malformed (``check``) or would inject headers or a second request (CR/LF, spaces).

The servers are threads in this process on 127.0.0.1 (see ``tests/helpers.py``);
loadgen runs as a subprocess, bounded in time.
"""

from __future__ import annotations

import json
import os
import socket
import urllib.parse
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

import loadgen
from loadgen.net.options import REDACTED, Redactor, parse_header
from loadgen.net.targets import parse_target, redact_url, url_secrets
from loadgen.net.template_http import load_template
from tests.helpers import GOOD, kserve, kserve_url, _send

TOKEN = "Hq4Lm8Rv2Xt6Jw9Z"  # distinctive: no three characters of it in a row occur in loadgen's text
KEY = "Pb3Ny7Dc5Gk1Vs8F"
LOAD = ("--scenario", "constant", "--target-qps", "20", "--duration-s", "0.5", "--max-issue-delay-ms", "100",
        "--grace-s", "5")


def cli_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment of a CLI subprocess: no LOADGEN_ variables but ``extra``, and the
    loadgen these tests import (an installed one, or a source tree) first on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOADGEN_")}
    root = str(Path(loadgen.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return {**env, **(extra or {})}


def cli(*args: object, env: Optional[Dict[str, str]] = None, timeout: float = 90) -> Tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``python -m loadgen ARGS``, killed past ``timeout``."""
    proc = subprocess.run([sys.executable, "-m", "loadgen", *map(str, args)], capture_output=True, text=True,
                          errors="replace", env=cli_env(env), timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def outputs(root: Path) -> Iterator[Tuple[str, str]]:
    """(name, text) of every file under ``root``, and of every path's name."""
    for path in sorted(root.rglob("*")):
        yield f"the name {path}", str(path.relative_to(root))
        if path.is_file():
            yield str(path), path.read_text(errors="replace")


def assert_no_secret(secrets: List[str], *texts: Tuple[str, str]) -> None:
    for name, text in texts:
        for secret in secrets:
            assert secret not in text, f"{name} holds {secret!r}"


def _echo_head(status: int = 401):
    """An infer answer: ``status`` with the request's head (request line and headers)
    echoed in its body, as a hostile or careless server does."""
    def infer(head: bytes, sock: socket.socket) -> bool:
        return _send(sock, status, json.dumps({"error": head.decode("latin-1")}).encode())
    return infer


def _template_route(status: int = 401):
    """Any request: ``status`` with the request's head echoed in the body."""
    def route(method: str, path: str, head: bytes, sock: socket.socket) -> bool:
        return _send(sock, status, json.dumps({"error": head.decode("latin-1")}).encode())
    return route


def _template(tmp_path: Path, obj: object, name: str = "tpl.json") -> Path:
    path = tmp_path / name
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return path


# ------------------------------------------------------------- a sweep's credentials

@pytest.mark.integration
def test_a_sweep_writes_no_header_secret_anywhere(tmp_path, serve):
    server = serve(kserve(_echo_head(401)))
    out_dir = tmp_path / "sweep"
    rc, out, err = cli("sweep", "--sut", kserve_url(server), *LOAD, "--duration-s", "0.3",
                       "--header", f"Authorization: Bearer {TOKEN}",
                       "--vary", f"header=X-Api-Key: {KEY}A,X-Api-Key: {KEY}B", "--output", out_dir)
    assert rc == 1, err  # every request failed (401): the points are invalid
    sent = b"".join(server.heads)
    assert f"{KEY}A".encode() in sent and f"{KEY}B".encode() in sent  # each point sent its own key
    manifest = json.loads((out_dir / "sweep.json").read_text())
    assert manifest["points"][0]["values"]["header"] == [f"X-Api-Key: {REDACTED}"]
    assert len(list((out_dir / "points").iterdir())) == 2  # two folders, named without the key
    assert_no_secret([TOKEN, KEY], ("stdout", out), ("stderr", err), *outputs(out_dir))
    # Resuming compares the redacted base options: the same command finds both points done.
    rc, out, err = cli("sweep", "--sut", kserve_url(server), *LOAD, "--duration-s", "0.3",
                       "--header", f"Authorization: Bearer {TOKEN}",
                       "--vary", f"header=X-Api-Key: {KEY}A,X-Api-Key: {KEY}B", "--output", out_dir)
    assert "2 done earlier, 0 to run" in out, out + err
    assert_no_secret([TOKEN, KEY], ("stdout", out), ("stderr", err))


# ------------------------------------------------ a request template's credentials

@pytest.mark.integration
def test_template_credentials_echoed_by_the_server_are_redacted_everywhere(tmp_path, serve):
    server = serve(_template_route(401))
    tpl = _template(tmp_path, {"method": "POST", "path": "/predict", "body": {"x": 1},
                               "headers": {"X-Api-Key": KEY, "Authorization": f"Bearer {TOKEN}"}})
    out_dir = tmp_path / "out"
    rc, out, err = cli("run", "--sut", f"http://127.0.0.1:{server.port}/predict", "--request-template", tpl,
                       *LOAD, "--output", out_dir)
    assert rc == 1, err
    assert server.heads and TOKEN.encode() in server.heads[-1] and KEY.encode() in server.heads[-1]
    doc = json.loads((out_dir / "result.json").read_text())
    assert list(doc["errors"]["counts"]) == ["http_401"]
    message = doc["errors"]["messages"][0]
    assert f"X-Api-Key: {REDACTED}" in message, message  # the echo, cut at 200 characters
    assert {"result.json", "summary.txt", "report.html"} <= {p.name for p in out_dir.iterdir()}
    assert_no_secret([TOKEN, KEY], ("stdout", out), ("stderr", err), *outputs(out_dir))


# ------------------------------------------------- secret query values in URLs

def test_secret_query_values_are_masked_in_shown_urls_and_kept_in_requests():
    url = f"http://u:pw99@127.0.0.1:1/predict?api_key={KEY}&n=3&Access-Token={TOKEN}&sig=ab%2Fcd"
    shown = redact_url(url)
    assert shown == (f"http://u:***@127.0.0.1:1/predict?api_key={REDACTED}&n=3&Access-Token={REDACTED}"
                     f"&sig={REDACTED}")
    target = parse_target(url, template=True)
    assert target.url == shown and target.path == f"/predict?api_key={KEY}&n=3&Access-Token={TOKEN}&sig=ab%2Fcd"
    assert set(url_secrets(url)) >= {"pw99", KEY, TOKEN, "ab%2Fcd", "ab/cd"}
    # In any text a run writes (an echoed request line, a settings value), by name alone.
    text = Redactor([]).text(f"POST /predict?n=1&api_key={KEY} HTTP/1.1 | GET /m?token={TOKEN}#x key=plain")
    assert text == f"POST /predict?n=1&api_key={REDACTED} HTTP/1.1 | GET /m?token={REDACTED}#x key=plain"
    assert url_secrets("http://h/p?key=1") == []  # too short to redact by value (it would hit every '1')


def _metrics_page(method: str, path: str, head: bytes, sock: socket.socket) -> bool:
    page = b"# TYPE requests_total counter\nrequests_total 1\n"
    if not path.startswith("/metrics?token="):
        return _send(sock, 401, head, content_type="text/plain")
    return _send(sock, 200, page, content_type="text/plain; version=0.0.4")


@pytest.mark.integration
def _bare_key_route(method: str, path: str, head: bytes, sock: socket.socket) -> bool:
    """403 naming the api_key's value alone, not as ``api_key=...``."""
    key = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)["api_key"][0]
    return _send(sock, 403, json.dumps({"error": f"the key {key} is not allowed"}).encode())


@pytest.mark.parametrize("echo", ["request_line", "bare_value"])
def test_secret_query_values_of_the_sut_and_metrics_urls_are_used_and_never_shown(tmp_path, serve, echo):
    # The server echoes the request line (with api_key=...), or the key's value alone.
    sut = serve(_template_route(403) if echo == "request_line" else _bare_key_route)
    metrics = serve(_metrics_page)
    tpl = _template(tmp_path, {"method": "POST", "body": {"x": 1}})
    out_dir = tmp_path / "out"
    rc, out, err = cli("run", "--sut", f"http://127.0.0.1:{sut.port}/predict?api_key={KEY}&n=1",
                       "--request-template", tpl, *LOAD, "--output", out_dir,
                       "--server-metrics-url", f"http://127.0.0.1:{metrics.port}/metrics?token={TOKEN}")
    assert rc == 1, err
    assert sut.heads[-1].startswith(f"POST /predict?api_key={KEY}&n=1 HTTP/1.1".encode())  # the real URL
    doc = json.loads((out_dir / "result.json").read_text())
    assert doc["server_metrics"]["scrapes"] >= 2 and doc["server_metrics"]["failed_scrapes"] == 0
    assert doc["server_metrics"]["url"] == f"http://127.0.0.1:{metrics.port}/metrics?token={REDACTED}"
    assert doc["network"]["target"] == f"http://127.0.0.1:{sut.port}/predict?api_key={REDACTED}&n=1"
    assert_no_secret([TOKEN, KEY], ("stdout", out), ("stderr", err), *outputs(out_dir))


# ---------------------------------------------------------- malformed --header values

@pytest.mark.parametrize("header, named", [
    (f"Authorization Bearer {TOKEN}", "it has no ':'"),
    (f"Authorization: Bearer {TOKEN}\r\nX-Injected: 1", "'Authorization'"),
    (f"Authorization: Bearer {TOKEN}\nHost: elsewhere", "'Authorization'"),
    (f"Authorization Bearer {TOKEN}: x", "a header name must be a token"),
])
@pytest.mark.parametrize("via", ["flag", "environment"])
def test_a_malformed_header_is_refused_naming_it_without_its_value(tmp_path, header, named, via):
    args = ("run", "--sut", "http://127.0.0.1:9/v2/models/m/infer", "--duration-s", "0.2")
    if via == "flag":
        rc, out, err = cli(*args, "--header", header)
    else:
        rc, out, err = cli(*args, env={"LOADGEN_HEADER": header})
    assert rc == 2 and named in err and "--header" in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert TOKEN not in out + err
    with pytest.raises(ValueError) as e:
        parse_header(header)
    assert TOKEN not in str(e.value)


# --------------------------------------------------------------- live /metrics labels

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.integration
def test_live_metrics_labels_are_redacted_like_the_result(tmp_path, serve):
    server = serve(kserve(lambda head, sock: _send(sock, 200, json.dumps(GOOD).encode())))
    port = _free_port()
    url = f"http://user:{KEY}x@127.0.0.1:{server.port}/v2/models/m/infer?api_key={KEY}"
    args = [sys.executable, "-m", "loadgen", "run", "--json", "--sut", url, "--scenario", "constant",
            "--target-qps", "20", "--duration-s", "4", "--grace-s", "5", "--max-issue-delay-ms", "500",
            "--header", f"Authorization: Bearer {TOKEN}", "--label", f"ticket={TOKEN}",
            "--metrics-port", port, "--metrics-linger-s", "0"]
    proc = subprocess.Popen(list(map(str, args)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env())
    page = ""
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    page = r.read().decode()
            except OSError:
                page = ""
            if "loadgen_queries_completed_total" in page:
                break
            time.sleep(0.1)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode in (0, 1), err
    assert "loadgen_run_info" in page, f"never scraped during the run\n{err.decode()}"
    assert f'sut="http://user:***@127.0.0.1:{server.port}/v2/models/m/infer?api_key={REDACTED}"' in page, page
    assert f'ticket="{REDACTED}"' in page, page
    doc = json.loads(out)
    assert doc["labels"]["ticket"] == REDACTED
    assert_no_secret([TOKEN, KEY], ("/metrics", page), ("stdout", out.decode()), ("stderr", err.decode()))


# ------------------------------------------------- malformed request template fields

@pytest.mark.parametrize("tpl, named", [
    ({"check": ["status", 200]}, "check must be an object"),
    ({"check": "200"}, "check must be an object"),
    ({"check": {"statuses": [200]}}, "check: unknown key(s) statuses"),
    ({"check": {"status": "200"}}, "check.status must be an HTTP status"),
    ({"check": {"status": [200, 700]}}, "check.status must be an HTTP status"),
    ({"check": {"status": [True]}}, "check.status must be an HTTP status"),
    ({"check": {"status": []}}, "check.status is an empty list"),
    ({"check": {"json_keys": "predictions"}}, "check.json_keys must be a list"),
    ({"check": {"json_keys": [["predictions"]]}}, "check.json_keys must be a list"),
    ({"headers": ["Authorization", "x"]}, "headers must be an object"),
    ({"headers": {"X-A": {"v": 1}}}, "headers: 'X-A': the value must be text or a number"),
    ({"path": 7}, "path must be text"),
    ({"ready_path": "health"}, "ready_path must start with '/'"),
    ("[1, 2]", "must be a JSON object"),
    ('{"method": ', "not JSON"),
])
def test_a_malformed_template_field_exits_2_naming_the_file_and_field(tmp_path, serve, tpl, named):
    server = serve(_template_route(200))
    path = _template(tmp_path, tpl)
    rc, out, err = cli("run", "--sut", f"http://127.0.0.1:{server.port}/p", "--request-template", path,
                       "--duration-s", "0.2", "--ready-timeout-s", "2")
    assert rc == 2, err
    assert f"--request-template {path}" in err and named in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert server.heads == []  # refused when read, before anything was sent


@pytest.mark.parametrize("tpl, named", [
    ({"method": "GET /admin HTTP/1.1\r\nX-Injected: 1\r\n\r\nGET"}, "method must be an HTTP method"),
    ({"method": "PO ST"}, "method must be an HTTP method"),
    ({"path": "/a b"}, "path holds a space"),
    ({"path": "/a\r\nX-Injected: 1"}, "path holds a control character"),
    ({"path": "/a HTTP/1.1\r\n\r\nGET /b"}, "path holds a space"),
    ({"ready_path": "/ready\nX: 1"}, "ready_path holds a control character"),
    ({"headers": {"X-A": f"v\r\nAuthorization: Bearer {TOKEN}"}}, "headers: header 'X-A': its value holds a CR"),
    ({"headers": {"Authorization": f"Bearer {TOKEN}\r\n\r\nGET / HTTP/1.1"}},
     "headers: header 'Authorization': its value holds a CR"),
    ({"headers": {"X-A\r\nX-B": "v"}}, "headers: a header name must be a token"),
    ({"headers": {"Bad Name": "v"}}, "headers: a header name must be a token"),
])
def test_template_fields_that_would_inject_are_refused_when_read(tmp_path, serve, tpl, named):
    server = serve(_template_route(200))
    path = _template(tmp_path, tpl)
    rc, out, err = cli("run", "--sut", f"http://127.0.0.1:{server.port}/p", "--request-template", path,
                       "--duration-s", "0.2", "--ready-timeout-s", "2")
    assert rc == 2 and named in err and str(path) in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert TOKEN not in out + err
    assert server.heads == []  # nothing was sent: no injected header, no second request
    with pytest.raises(ValueError):
        load_template(str(path))


def test_a_valid_template_loads_with_its_checks():
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"method": "put", "headers": {"X-N": 3}, "body": {"a": "{{sample}}"},
                   "check": {"status": 201, "json_keys": ["ok"]}}, f)
    try:
        tpl = load_template(f.name, "/default")
    finally:
        os.unlink(f.name)
    assert tpl["method"] == "PUT" and tpl["path"] == "/default" and tpl["headers"] == [("X-N", "3")]
    assert tpl["status"] == frozenset({201}) and tpl["json_keys"] == ["ok"]


@pytest.mark.parametrize("path, named", [("/v2/models/m/infer x", "holds a space"),
                                         ("/v2/models/m/infer\r\nX-Injected: 1", "control character"),
                                         ("/v2/models/m/\tinfer", "control character")])
def test_a_sut_url_with_spaces_or_control_characters_exits_2(tmp_path, serve, path, named):
    server = serve(kserve(lambda head, sock: _send(sock, 200, json.dumps(GOOD).encode())))
    rc, out, err = cli("run", "--sut", f"http://127.0.0.1:{server.port}{path}", "--duration-s", "0.2",
                       "--ready-timeout-s", "2")
    assert rc == 2 and "--sut" in err and named in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert server.heads == []
