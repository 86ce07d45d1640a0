"""An inference server that embeds loadgen: it serves a small model over HTTP and, on
``POST /loadgen/run``, benchmarks that same model in-process and answers with the verdict.

    python examples/embedded_server/server.py --port 8080
    curl -s localhost:8080/v1/models/tiny:predict -d '{"instances": [[0.1, 0.2, ...16 values]]}'
    curl -s localhost:8080/loadgen/run -d '{"scenario": "poisson", "target_qps": 200, "duration_s": 2}'

Only the Python standard library, numpy and loadgen. Each request is handled on a thread
of its own (``ThreadingHTTPServer``): the benchmark runs on a handler thread, not the main
thread, which loadgen allows (it installs no signal handler and, unless asked, changes
no process-wide state). One benchmark at a time: two would share the CPUs and each
measure the other, so a second gets 409.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Tuple

import numpy as np

import loadgen

MAX_BODY_BYTES = 64 * 1024
MAX_DURATION_S = 60.0
DEFAULT_DURATION_S = 10.0
FEATURES, CLASSES, SAMPLES = 16, 4, 256

# The loadgen options a client may set: the load and the verdict's rules. Nothing that
# names a target, a file or a port: the benchmark is of this server's model alone.
RUN_OPTIONS = {"scenario", "target_qps", "duration_s", "query_count", "concurrency", "max_in_flight", "stages",
               "ramp", "poisson_arrivals", "burstiness", "latency_bound_ms", "latency_percentile",
               "max_error_rate", "max_issue_delay_ms", "fail_if", "require", "slo", "warmup_s", "timeout_ms",
               "interval_s", "seed", "sample_count", "label"}


class TinyModel:
    """A dense layer and a softmax: FEATURES inputs to CLASSES probabilities."""

    name = "tiny"

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.weights = rng.standard_normal((FEATURES, CLASSES)).astype(np.float32)
        self.bias = rng.standard_normal(CLASSES).astype(np.float32)
        # The benchmark's inputs: loadgen draws sample indices into them.
        self.samples = rng.standard_normal((SAMPLES, FEATURES)).astype(np.float32)

    def predict(self, x: np.ndarray) -> np.ndarray:
        logits = x @ self.weights + self.bias
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    def predict_sample(self, index: int) -> None:
        """The SUT loadgen calls: one query, complete when it returns."""
        self.predict(self.samples[index % SAMPLES][None, :])


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: Tuple[str, int]) -> None:
        super().__init__(address, Handler)
        self.model = TinyModel()
        self.benchmark_lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per benchmark instead
        pass

    def _send(self, status: int, body: Dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            raise ValueError(f"the body is {length} bytes, more than {MAX_BODY_BYTES}")
        return json.loads(self.rfile.read(length) or b"{}")

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, {"status": "ok", "loadgen": loadgen.__version__})
        else:
            self._send(404, {"error": f"no route GET {self.path}"})

    def do_POST(self) -> None:
        try:
            body = self._body()
        except ValueError as e:
            self._send(400, {"error": f"bad request body: {e}"})
            return
        if self.path == f"/v1/models/{self.server.model.name}:predict":
            self._predict(body)
        elif self.path == "/loadgen/run":
            self._benchmark(body)
        else:
            self._send(404, {"error": f"no route POST {self.path}"})

    def _predict(self, body: Any) -> None:
        try:
            x = np.asarray(body["instances"], dtype=np.float32)
            if x.ndim != 2 or x.shape[1] != FEATURES:
                raise ValueError(f"instances must be rows of {FEATURES} numbers, got shape {list(x.shape)}")
        except (KeyError, TypeError, ValueError) as e:
            self._send(400, {"error": f"bad instances: {e}"})
            return
        self._send(200, {"predictions": self.server.model.predict(x).tolist()})

    def _benchmark(self, body: Any) -> None:
        if not isinstance(body, dict):
            self._send(400, {"error": "the body must be a JSON object of loadgen run options"})
            return
        refused = sorted(set(body) - RUN_OPTIONS)
        if refused:
            self._send(400, {"error": f"not an option this server takes: {', '.join(refused)} "
                                      f"(it takes {', '.join(sorted(RUN_OPTIONS))})"})
            return
        duration_s = body.get("duration_s", DEFAULT_DURATION_S)
        if not isinstance(duration_s, (int, float)) or not 0 < duration_s <= MAX_DURATION_S:
            self._send(400, {"error": f"duration_s must be a number of seconds above 0 and at most "
                                      f"{MAX_DURATION_S:g} here, got {duration_s!r}"})
            return
        if not self.server.benchmark_lock.acquire(blocking=False):
            self._send(409, {"error": "a benchmark is running; try again when it has ended"})
            return
        try:
            # Always bounded in time: a query_count alone stops at duration_s too.
            options = {"scenario": "poisson", **body, "duration_s": duration_s}
            result = loadgen.run(sut=self.server.model.predict_sample, sut_name=f"model {self.server.model.name}",
                                 **options)
        except ValueError as e:  # a bad option: the message names it
            self._send(400, {"error": str(e)})
            return
        except Exception as e:  # the run failed: say so, and keep serving
            self._send(500, {"error": f"the benchmark failed: {type(e).__name__}: {e}"})
            return
        finally:
            self.server.benchmark_lock.release()
        print(result.summary().splitlines()[0], flush=True)
        self._send(200, {**result.verdict(), "summary": result.summary()})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    server = Server((args.host, args.port))
    print(f"listening on http://{args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
