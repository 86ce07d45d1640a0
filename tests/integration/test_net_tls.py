"""TLS for network targets: verified by default, against --ca-file, or skipped with
--insecure; a certificate that does not verify fails readiness with exit 2. The server is
a small threaded HTTPS KServe v2 server in this process, with a certificate made by the
openssl command for 127.0.0.1."""

import json
import shutil
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.helpers import run_cli

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")]

META = {"name": "m", "versions": ["1"], "platform": "test",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 4]}]}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen_auth: list = []

    def _send(self, status, doc):
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path in ("/v2/health/ready", "/v2/models/m/ready"):
            self._send(200, {"ready": True})
        elif self.path == "/v2/models/m":
            self._send(200, META)
        else:
            self._send(404, {"error": "no"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen_auth.append(self.headers.get("Authorization"))
        data = [x + 1 for x in body["inputs"][0]["data"]]
        self._send(200, {"model_name": "m", "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 4],
                                                          "data": data}]})

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def https_server(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_port}/v2/models/m/infer", str(cert)
    finally:
        server.shutdown()
        server.server_close()


def _run(*args):
    return run_cli("run", "--json", "--scenario", "concurrency", "--concurrency", "2", "--query-count", "40",
                   "--max-issue-delay-ms", "100", *args, timeout=60)


def test_tls_verified_against_the_ca_file(https_server):
    url, cert = https_server
    _Handler.seen_auth.clear()
    proc = _run("--sut", url, "--ca-file", cert, "--header", "Authorization: Bearer tls-secret")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["counts"]["completed"] == 40 and doc["network"]["responses_checked"] == 40
    assert set(_Handler.seen_auth) == {"Bearer tls-secret"}  # sent to the server, redacted in the result
    assert "tls-secret" not in proc.stdout


def test_an_unverifiable_certificate_is_exit_2_and_insecure_skips_the_check(https_server):
    url, _ = https_server
    proc = run_cli("run", "--sut", url, "--ready-timeout-s", "1", "--query-count", "5", timeout=60)
    # Said by the native client's handshake (auto runs https:// on it), as Python's ssl words it.
    assert proc.returncode == 2 and "certificate verify failed: self-signed certificate" in proc.stderr.lower()
    asyncio = run_cli("run", "--sut", url, "--http-engine", "asyncio", "--ready-timeout-s", "1", "--query-count", "5",
                      timeout=60)
    assert asyncio.returncode == 2 and "CERTIFICATE_VERIFY_FAILED" in asyncio.stderr
    proc = _run("--sut", url, "--insecure")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["counts"]["completed"] == 40


def test_a_missing_ca_file_is_named(https_server):
    url, _ = https_server
    proc = run_cli("run", "--sut", url, "--ca-file", "/nonexistent/ca.pem", "--query-count", "5", timeout=60)
    assert proc.returncode == 2 and "--ca-file" in proc.stderr and "/nonexistent/ca.pem" in proc.stderr
