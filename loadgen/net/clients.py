"""The network SUTs: clients of real inference servers that the engine drives like any
other SUT (they are loop SUTs, see :class:`loadgen.sut.LoopSUT`).

Each client does its slow work before the timed run, in :meth:`NetworkSUT.prepare`: it
waits for the server to be ready, reads the model's metadata, and serializes one request
per distinct sample, so that the hot path only sends prepared bytes. Every response is
checked by default; a failed request is counted by its error class (connect_refused,
connection_reset, timeout, http_<status>, grpc_<CODE>, invalid_response) and the run
goes on.
"""

from __future__ import annotations

import asyncio
import collections
import json
import math
import re
import time
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from loadgen.stats.histogram import Histogram
from loadgen.net import kserve
from loadgen.net.http1 import HttpPool, Request
from loadgen.net.options import NetOptions, ssl_context
from loadgen.net.targets import Target, host_port, model_path
from loadgen.net.tensors import InputSpec, load_samples, numpy_dtype, synthetic_samples
from loadgen.sut.forms import LoopSUT

__all__ = ["NetworkSUT", "KServeHttpSUT", "KServeGrpcSUT", "TemplateHttpSUT", "OpenAISUT", "open_target"]

_monotonic_ns = time.monotonic_ns
_SYNTHETIC_MAX = 256  # distinct synthetic samples prepared (indices wrap around them)
_WARM_MAX = 1024  # connections opened before the run; more open as the load needs them
_MEMO_MAX_BYTES = 64 * 1024  # responses up to this size have their check remembered
_MEMO_MAX_ENTRIES = 4096


class NetworkSUT(LoopSUT):
    """What the network clients share: readiness, payloads, checks and the report.

    Args:
        target: the parsed ``--sut`` URL.
        net: the client options.
        pool_size: connections to open when ``net.connections`` is 0.
    """

    protocol = ""

    def __init__(self, target: Target, net: NetOptions, pool_size: int) -> None:
        self.target = target
        self.net = net
        self.connections = net.connections or pool_size
        self.redactor = net.redactor()
        self.check = net.check_responses
        self.ready_wait_s = 0.0
        self.metadata: Optional[kserve.ModelMetadata] = None
        self.payload_source = ""
        self.payload_bytes: List[int] = []
        self.checked = 0
        self.sink: Any = None
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.timeout_ns = int(net.timeout_ms * 1e6) if net.timeout_ms else 0
        self._memo: Dict[bytes, Optional[str]] = {}

    # -- before the run
    def prepare(self) -> None:
        """Waits for readiness, reads metadata and serializes the requests.

        Raises:
            ValueError: the server never became ready, or the payload does not fit; the
                message says which and what to do.
        """
        raise NotImplementedError

    def _wait_ready(self, probe, what: str) -> None:
        """Calls ``probe() -> (ready, detail)`` until it is ready or the readiness
        timeout passes."""
        start = time.monotonic()
        deadline = start + self.net.ready_timeout_s
        detail = ""
        while True:
            ready, detail = probe(max(0.2, min(2.0, deadline - time.monotonic())))
            if ready:
                self.ready_wait_s = time.monotonic() - start
                return
            if time.monotonic() >= deadline:
                raise ValueError(self.redactor.text(
                    f"{what} was not ready within {self.net.ready_timeout_s:g} s ({detail}); check that "
                    "the server is running there, or wait longer with --ready-timeout-s"))
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    # -- the report
    def report(self) -> Dict[str, Any]:
        """What the result document says about the client side (redacted)."""
        out: Dict[str, Any] = {
            "target": self.target.url,
            "protocol": self.protocol,
            "connections": self.connections,
            "ready_wait_s": self.ready_wait_s,
            "response_check": self.check,
            "responses_checked": self.checked,
            "payload": {
                "source": self.payload_source,
                "distinct_requests": len(self.payload_bytes),
                "request_bytes_mean": float(np.mean(self.payload_bytes)) if self.payload_bytes else 0.0,
            },
            "headers": [f"{k}: {v}" for k, v in self.net.headers],
        }
        if self.metadata is not None:
            out["model_metadata"] = self.metadata.as_dict()
        return self.redactor.doc(out)

    def _fail(self, qid: int, kind: str, message: str) -> None:
        self.sink.fail(qid, kind, self.redactor.text(message))

    def _checked(self, body: bytes, check) -> Optional[str]:
        """``check(body)``, remembered by the response's bytes: a check is a function of
        the bytes alone, and a model answering the same prepared requests mostly sends
        the same bytes back, so most responses are checked by one dictionary lookup."""
        self.checked += 1
        if len(body) > _MEMO_MAX_BYTES:
            return check(body)
        memo = self._memo
        try:
            return memo[body]
        except KeyError:
            problem = check(body)
            if len(memo) < _MEMO_MAX_ENTRIES:
                memo[body] = problem
            return problem


# --------------------------------------------------------------------------- HTTP base

def _http_get(url: str, headers: Sequence[Tuple[str, str]], timeout_s: float, ctx) -> Tuple[int, bytes, str]:
    """(status, body, problem) of a GET; status 0 and the problem when nothing answered."""
    req = urllib.request.Request(url, headers=dict(headers), method="GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s, context=ctx) as r:
            return r.status, r.read(), ""
    except urllib.error.HTTPError as e:
        return e.code, e.read(), f"HTTP {e.code}"
    except urllib.error.URLError as e:
        reason = e.reason
        return 0, b"", getattr(reason, "strerror", None) or str(reason)
    except (OSError, ValueError) as e:
        return 0, b"", f"{type(e).__name__}: {e}"


class _HttpSUT(NetworkSUT):
    """A client over the lean HTTP/1.1 pool: requests are prepared bytes."""

    def __init__(self, target: Target, net: NetOptions, pool_size: int) -> None:
        super().__init__(target, net, pool_size)
        self.ssl = ssl_context(net.ca_file, net.insecure) if target.tls else None
        self.requests: List[bytes] = []
        self.pool: Optional[HttpPool] = None
        self._stream = False
        self._head_only = False

    def _get(self, path: str, timeout_s: float) -> Tuple[int, bytes, str]:
        return _http_get(self.target.http_base + path, self.net.headers, timeout_s, self.ssl)

    def _serialize(self, method: str, path: str, body: Optional[bytes],
                   headers: Sequence[Tuple[str, str]] = ()) -> bytes:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.target.host_header}",
                 "User-Agent: loadgen", "Accept: */*"]
        given = {k.lower() for k, _ in list(headers) + list(self.net.headers)}
        if body is not None:
            if "content-type" not in given:
                lines.append("Content-Type: application/json")
            lines.append(f"Content-Length: {len(body)}")
        lines += [f"{k}: {v}" for k, v in headers]
        lines += [f"{k}: {v}" for k, v in self.net.headers]
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return data + body if body is not None else data

    def _set_requests(self, requests: List[bytes], source: str) -> None:
        if not requests:
            raise ValueError(f"--payload: {source} gave no requests")
        self.requests = requests
        self.payload_bytes = [len(r) for r in requests]
        self.payload_source = source

    async def open_on_loop(self, loop, sink) -> None:
        self.loop, self.sink = loop, sink
        self.pool = HttpPool(loop, self.target.host, self.target.port, self.connections,
                             ssl_context=self.ssl, server_hostname=self.target.host)
        self.warm_connections = await self.pool.warm(min(self.connections, _WARM_MAX))

    async def close_on_loop(self) -> None:
        if self.pool is not None:
            self.pool.close()

    def issue_query(self, query_id: int, sample_index: int, scheduled_ns: int) -> None:
        req = Request(self.requests[sample_index % len(self.requests)], self, query_id, self._stream,
                      self._head_only)
        self.pool.submit(req, scheduled_ns + self.timeout_ns if self.timeout_ns else 0)

    def on_error(self, req: Request, kind: str, message: str) -> None:
        self._fail(req.query_id, kind, message)

    def report(self) -> Dict[str, Any]:
        out = super().report()
        if self.pool is not None:
            out.update(connects=self.pool.connects, connect_failures=self.pool.connect_failures,
                       connections_opened_before_run=self.warm_connections, bytes_sent=self.pool.bytes_sent)
        return out


def _read_jsonl(path: str) -> List[Any]:
    """The JSON values of a JSON-lines file; ValueError naming the bad line."""
    values = []
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    values.append(json.loads(line))
                except ValueError as e:
                    raise ValueError(f"--payload: {path} line {number} is not JSON: {e}") from None
    except OSError as e:
        raise ValueError(f"--payload: cannot read {path}: {e.strerror or e}") from None
    if not values:
        raise ValueError(f"--payload: {path} has no lines")
    return values


def _payload_kind(path: str) -> str:
    for ext in (".npy", ".npz", ".jsonl", ".ndjson"):
        if path.endswith(ext):
            return "jsonl" if ext == ".ndjson" else ext[1:]
    raise ValueError(f"--payload: {path}: use a .npy or .npz file of samples, or a .jsonl file of request bodies")


def _samples_from_kserve_json(body: Any, where: str) -> Dict[str, np.ndarray]:
    """A sample from a KServe v2 JSON request body."""
    if not isinstance(body, dict) or not isinstance(body.get("inputs"), list):
        raise ValueError(f"{where}: not a KServe v2 request (an object with an inputs list)")
    sample = {}
    for t in body["inputs"]:
        try:
            dtype = numpy_dtype(str(t["datatype"]))
            data = t["data"] if dtype.kind != "O" else [str(v).encode() for v in np.ravel(t["data"])]
            sample[t["name"]] = np.asarray(data, dtype=dtype).reshape([int(d) for d in t["shape"]])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{where}: input {t.get('name') if isinstance(t, dict) else t!r}: {e}") from None
    return sample


# ------------------------------------------------------------------------- KServe REST

class _KServeInputs:
    """How a KServe client finds its input specs and samples."""

    net: NetOptions
    metadata: Optional[kserve.ModelMetadata]
    target: Target

    def input_specs(self) -> List[InputSpec]:
        if self.net.inputs:
            return list(self.net.inputs)
        if self.metadata is not None and self.metadata.inputs:
            return list(self.metadata.inputs)
        raise ValueError(
            f"the server gave no input metadata for model {self.target.model!r} (MLServer omits it for some "
            "runtimes); give --input NAME:DTYPE:SHAPE for each input, or --payload FILE")

    def samples(self) -> Tuple[List[Dict[str, np.ndarray]], List[InputSpec], str]:
        limit = self.net.sample_count
        path = self.net.payload
        if path and _payload_kind(path) in ("npy", "npz"):
            specs = None
            if self.net.inputs or (self.metadata is not None and self.metadata.inputs):
                specs = self.input_specs()
            samples = load_samples(path, specs, limit)
            if specs is None:
                first = samples[0]
                specs = [InputSpec(k, _datatype_of(v), tuple(np.shape(v))) for k, v in first.items()]
            return samples, specs, path
        specs = self.input_specs()
        count = min(limit, _SYNTHETIC_MAX)
        return synthetic_samples(specs, count, self.net.seed), specs, f"synthetic ({count} samples, seed {self.net.seed})"

    def expected_outputs(self) -> List[InputSpec]:
        return list(self.metadata.outputs) if self.metadata is not None else []


def _datatype_of(arr: np.ndarray) -> str:
    for name, dtype in (("BOOL", np.bool_), ("UINT8", np.uint8), ("UINT16", np.uint16), ("UINT32", np.uint32),
                        ("UINT64", np.uint64), ("INT8", np.int8), ("INT16", np.int16), ("INT32", np.int32),
                        ("INT64", np.int64), ("FP16", np.float16), ("FP32", np.float32), ("FP64", np.float64)):
        if np.asarray(arr).dtype == np.dtype(dtype):
            return name
    return "BYTES"


class KServeHttpSUT(_KServeInputs, _HttpSUT):
    """KServe v2 REST: ``POST /v2/models/NAME[/versions/V]/infer`` with JSON tensors."""

    protocol = "kserve_v2_http"

    def prepare(self) -> None:
        base = self.target.http_base

        def probe(timeout_s: float):
            status, _, problem = self._get("/v2/health/ready", timeout_s)
            if status != 200:
                return False, f"GET {base}/v2/health/ready: {problem or status}"
            status, _, problem = self._get(model_path(self.target) + "/ready", timeout_s)
            if status != 200:
                return False, f"model {self.target.model!r} not ready: GET {model_path(self.target)}/ready: {problem or status}"
            return True, ""

        self._wait_ready(probe, f"KServe server {base}")
        status, body, problem = self._get(model_path(self.target), 10.0)
        if status == 200:
            try:
                self.metadata = kserve.parse_metadata(json.loads(body))
            except ValueError as e:
                raise ValueError(f"GET {base}{model_path(self.target)}: {e}") from None
        elif not self.net.inputs and not self.net.payload:
            raise ValueError(f"GET {base}{model_path(self.target)} answered {problem or status}; "
                             "give --input NAME:DTYPE:SHAPE or --payload FILE")
        self.expected = self.expected_outputs()
        path = self.target.path
        if self.net.payload and _payload_kind(self.net.payload) == "jsonl":
            bodies = _read_jsonl(self.net.payload)[: self.net.sample_count]
            if any(isinstance(b, dict) and b.get("outputs") for b in bodies):
                self.expected = []  # the requests choose their outputs
            raw = _raw_lines(self.net.payload, len(bodies))
            self._set_requests([self._serialize("POST", path, line) for line in raw], self.net.payload)
            return
        samples, specs, source = self.samples()
        self._set_requests([self._serialize("POST", path, kserve.json_request_body(s, specs)) for s in samples],
                           source)

    def _check_json(self, body: bytes) -> Optional[str]:
        return kserve.check_json_response(body, self.expected)

    def on_response(self, req: Request, status: int, body: bytes, t: int) -> None:
        if status != 200:
            self._fail(req.query_id, f"http_{status}", f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}")
            return
        if self.check:
            problem = self._checked(body, self._check_json)
            if problem is not None:
                self._fail(req.query_id, "invalid_response", problem)
                return
        self.sink.complete(req.query_id, t)


def _raw_lines(path: str, count: int) -> List[bytes]:
    """The first ``count`` non-blank lines of a file, as bytes without the newline (the
    bodies are sent exactly as written)."""
    out = []
    with open(path, "rb") as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(line)
                if len(out) == count:
                    break
    return out


# ------------------------------------------------------------------------- generic JSON

_PLACEHOLDER = re.compile(r"\{\{\s*(sample(?:\.[A-Za-z0-9_\-]+)?|sample_index)\s*\}\}")


class TemplateHttpSUT(_HttpSUT):
    """Any JSON API over HTTP, from a ``--request-template`` file.

    The template is a JSON object: ``method`` (default POST, or GET without a body),
    ``path`` (default: the URL's), ``headers`` (object), ``body`` (any JSON; a string that
    is exactly ``{{sample}}``, ``{{sample.KEY}}`` or ``{{sample_index}}`` is replaced by
    that value, and inside a longer string by its JSON text), ``ready_path`` (polled for a
    2xx before the run; default: any TCP connect) and ``check``: ``{"status": [200],
    "json_keys": ["predictions"]}`` (the statuses that pass, default any 2xx, and keys the
    JSON response object must have, non-empty).
    """

    protocol = "http_json_template"

    def prepare(self) -> None:
        path = self.net.request_template
        try:
            with open(path, encoding="utf-8") as f:
                tpl = json.load(f)
        except OSError as e:
            raise ValueError(f"--request-template: cannot read {path}: {e.strerror or e}") from None
        except ValueError as e:
            raise ValueError(f"--request-template: {path} is not JSON: {e}") from None
        if not isinstance(tpl, dict):
            raise ValueError(f"--request-template: {path} must be a JSON object")
        unknown = set(tpl) - {"method", "path", "headers", "body", "ready_path", "check"}
        if unknown:
            raise ValueError(f"--request-template: {path}: unknown key(s) {', '.join(sorted(unknown))} "
                             "(known: method, path, headers, body, ready_path, check)")
        method = str(tpl.get("method", "POST" if "body" in tpl else "GET")).upper()
        self._head_only = method == "HEAD"
        req_path = str(tpl.get("path", self.target.path))
        if not req_path.startswith("/"):
            raise ValueError(f"--request-template: {path}: path must start with '/', got {req_path!r}")
        headers = tpl.get("headers") or {}
        if not isinstance(headers, dict):
            raise ValueError(f"--request-template: {path}: headers must be an object")
        check = tpl.get("check") or {}
        statuses = check.get("status")
        self.ok_status = frozenset(int(s) for s in statuses) if statuses else None
        self.json_keys = [str(k) for k in check.get("json_keys", [])]
        ready_path = tpl.get("ready_path")
        self._wait_ready(self._ready_probe(ready_path), f"server {self.target.http_base}")
        body_tpl = tpl.get("body")
        uses_sample = body_tpl is not None and "{{" in json.dumps(body_tpl) and "sample" in json.dumps(body_tpl)
        samples, source = self._template_samples(uses_sample)
        header_items = [(str(k), str(v)) for k, v in headers.items()]
        requests = []
        for i, sample in enumerate(samples):
            body = None
            if body_tpl is not None:
                body = json.dumps(_fill(body_tpl, sample, i), separators=(",", ":")).encode()
            requests.append(self._serialize(method, req_path, body, header_items))
        self._set_requests(requests, source)

    def _ready_probe(self, ready_path: Optional[str]):
        host, port = self.target.host, self.target.port

        def probe(timeout_s: float):
            if ready_path:
                status, _, problem = self._get(str(ready_path), timeout_s)
                return 200 <= status < 300, f"GET {ready_path}: {problem or status}"
            import socket

            try:
                socket.create_connection((host, port), timeout=timeout_s).close()
                return True, ""
            except OSError as e:
                return False, f"connect {host}:{port}: {e.strerror or e}"
        return probe

    def _template_samples(self, uses_sample: bool) -> Tuple[List[Any], str]:
        path = self.net.payload
        limit = self.net.sample_count
        if path:
            kind = _payload_kind(path)
            if kind == "jsonl":
                return _read_jsonl(path)[:limit], path
            samples = load_samples(path, list(self.net.inputs) or None, limit)
            values = [{k: np.asarray(v).tolist() for k, v in s.items()} for s in samples]
            if kind == "npy":
                values = [next(iter(v.values())) for v in values]
            return values, path
        if self.net.inputs:
            count = min(limit, _SYNTHETIC_MAX)
            samples = synthetic_samples(self.net.inputs, count, self.net.seed)
            values = [{k: np.asarray(v).tolist() for k, v in s.items()} for s in samples]
            if len(self.net.inputs) == 1:
                values = [next(iter(v.values())) for v in values]
            return values, f"synthetic ({count} samples, seed {self.net.seed})"
        if uses_sample:
            raise ValueError("--request-template uses {{sample}} but there is no --payload FILE or --input spec")
        return [None], "template only"

    def on_response(self, req: Request, status: int, body: bytes, t: int) -> None:
        ok = status in self.ok_status if self.ok_status is not None else 200 <= status < 300
        if not ok:
            self._fail(req.query_id, f"http_{status}", f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}")
            return
        if self.check and self.json_keys:
            self.checked += 1
            try:
                doc = json.loads(body)
            except (ValueError, UnicodeDecodeError):
                self._fail(req.query_id, "invalid_response", f"the response is not JSON: {body[:80]!r}")
                return
            missing = [k for k in self.json_keys if not isinstance(doc, dict) or doc.get(k) in (None, [], {}, "")]
            if missing:
                self._fail(req.query_id, "invalid_response", f"the response has no (or an empty) {missing[0]!r}")
                return
        self.sink.complete(req.query_id, t)


def _fill(node: Any, sample: Any, index: int) -> Any:
    """The template ``node`` with its placeholders filled."""
    if isinstance(node, dict):
        return {k: _fill(v, sample, index) for k, v in node.items()}
    if isinstance(node, list):
        return [_fill(v, sample, index) for v in node]
    if not isinstance(node, str) or "{{" not in node:
        return node

    def value(name: str) -> Any:
        if name == "sample_index":
            return index
        if name == "sample":
            return sample
        key = name.split(".", 1)[1]
        if not isinstance(sample, dict) or key not in sample:
            raise ValueError(f"--request-template: {{{{{name}}}}}: the sample has no key {key!r}")
        return sample[key]

    whole = _PLACEHOLDER.fullmatch(node.strip())
    if whole:
        return value(whole.group(1))
    return _PLACEHOLDER.sub(lambda m: v if isinstance(v := value(m.group(1)), str) else json.dumps(v), node)


# ------------------------------------------------------------------------ OpenAI stream

# A non-empty "text" (completions) or "content" (chat delta) string value.
_TOKEN_FIELD = re.compile(rb'"(?:text|content)"\s*:\s*"(?!")')


class _Stream:
    """One streamed completion: Server-Sent Events parsed as they arrive."""

    __slots__ = ("sut", "query_id", "scheduled_ns", "buf", "first_ns", "last_ns", "chunks", "usage_tokens",
                 "done", "error", "gaps")

    def __init__(self, sut: "OpenAISUT", query_id: int, scheduled_ns: int) -> None:
        self.sut = sut
        self.query_id = query_id
        self.scheduled_ns = scheduled_ns
        self.buf = b""
        self.first_ns = 0
        self.last_ns = 0
        self.chunks = 0
        self.usage_tokens = -1
        self.done = False
        self.error: Optional[str] = None
        self.gaps: List[int] = []

    def on_data(self, req: Request, piece: bytes, t: int) -> None:
        buf = self.buf + piece
        while True:
            end = buf.find(b"\n\n")
            if end < 0:
                crlf = buf.find(b"\r\n\r\n")
                if crlf < 0:
                    break
                event, buf = buf[:crlf], buf[crlf + 4:]
            else:
                event, buf = buf[:end], buf[end + 2:]
            self._event(event, t)
        self.buf = buf

    def _event(self, event: bytes, t: int) -> None:
        if event.startswith(b"data: {") and b"\n" not in event:  # the usual one-line event
            data = event[6:]
        else:
            data = b"\n".join(line[5:].lstrip() for line in event.replace(b"\r\n", b"\n").split(b"\n")
                              if line.startswith(b"data:"))
        if not data:
            return
        if data == b"[DONE]":
            self.done = True
            return
        # Fast path: a plain token chunk (no usage, no error) is recognised without
        # building its JSON; anything else is parsed in full.
        if data[:1] == b"{" and data[-1:] == b"}" and b'"usage"' not in data and b'"error"' not in data:
            if _TOKEN_FIELD.search(data):
                self._token(t)
            return
        try:
            doc = json.loads(data.decode("utf-8", "replace"))
        except ValueError:
            self.error = self.error or f"an event is not JSON: {data[:80]!r}"
            return
        if not isinstance(doc, dict):
            self.error = self.error or f"an event is not a JSON object: {data[:80]!r}"
            return
        if "error" in doc:
            self.error = self.error or f"the server sent an error event: {json.dumps(doc['error'])[:200]}"
            return
        usage = doc.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage_tokens = usage["completion_tokens"]
        for choice in doc.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if text:
                self._token(t)

    def _token(self, t: int) -> None:
        if self.first_ns == 0:
            self.first_ns = t
            self.sut.sink.first_token(self.query_id, t)
        else:
            self.gaps.append(t - self.last_ns)
        self.last_ns = t
        self.chunks += 1

    def on_response(self, req: Request, status: int, body: bytes, t: int) -> None:
        sut = self.sut
        if status != 200:
            text = self.buf[:200].decode("utf-8", "replace")
            self.buf = b""
            sut._fail(self.query_id, f"http_{status}", f"HTTP {status}: {text}")
            return
        if self.buf.strip():
            self._event(self.buf, t)
        problem = self.error
        if problem is None and sut.check:
            sut.checked += 1
            if self.chunks == 0:
                problem = "the stream had no tokens"
            elif not self.done:
                problem = "the stream ended without data: [DONE]"
        if problem is not None:
            sut._fail(self.query_id, "invalid_response", problem)
            return
        sut.record_stream(self, t)

    def on_error(self, req: Request, kind: str, message: str) -> None:
        self.sut._fail(self.query_id, kind, message)


class OpenAISUT(_HttpSUT):
    """OpenAI-compatible ``/v1/completions`` or ``/v1/chat/completions`` with
    ``"stream": true``: time to first token, each inter-token gap, time per output token
    and output tokens per second, with the token count from the ``usage`` the server
    sends, else from the chunks."""

    protocol = "openai_stream"

    def __init__(self, target: Target, net: NetOptions, pool_size: int, significant_figures: int = 3) -> None:
        super().__init__(target, net, pool_size)
        self._stream = True
        self.model = net.model
        self._itl = Histogram(significant_figures=significant_figures, highest_trackable_value=3_600_000_000_000)
        self.tokens_per_s = Histogram(significant_figures=significant_figures)  # milli-tokens/s
        self._gaps: List[int] = []  # inter-token gaps not yet in the histogram
        self.tokens_from_usage = 0
        self.tokens_from_chunks = 0
        self.output_tokens = 0

    def prepare(self) -> None:
        base = self.target.http_base + self.target.base_path
        models_path = self.target.base_path + "/v1/models"
        listed: List[str] = []

        def probe(timeout_s: float):
            status, body, problem = self._get(models_path, timeout_s)
            if status == 200:
                try:
                    listed[:] = [str(m["id"]) for m in json.loads(body).get("data", [])]
                except (ValueError, KeyError, TypeError, AttributeError):
                    pass
                return True, ""
            if status in (404, 405) and (self.model or self.net.payload):  # no /v1/models here
                return True, ""
            return False, f"GET {base}/v1/models: {problem or status}"

        self._wait_ready(probe, f"OpenAI server {base}")
        if not self.model and not self.net.payload:
            if not listed:
                raise ValueError(f"GET {base}/v1/models listed no model; give --model NAME")
            self.model = listed[0]
        bodies, source = self._bodies()
        self._set_requests([self._serialize("POST", self.target.path,
                                            json.dumps(b, separators=(",", ":")).encode()) for b in bodies], source)

    def _bodies(self) -> Tuple[List[dict], str]:
        chat = self.target.endpoint == "chat"
        if self.net.payload:
            if _payload_kind(self.net.payload) != "jsonl":
                raise ValueError("--payload: an OpenAI target takes a .jsonl file of request bodies")
            bodies = []
            for i, b in enumerate(_read_jsonl(self.net.payload)[: self.net.sample_count]):
                if not isinstance(b, dict):
                    raise ValueError(f"--payload: {self.net.payload}: line {i + 1} is not a JSON object")
                key = "messages" if chat else "prompt"
                if key not in b:
                    raise ValueError(f"--payload: {self.net.payload}: line {i + 1} has no {key!r} "
                                     f"(this target is /v1/{'chat/' if chat else ''}completions)")
                b = dict(b)
                if "model" not in b and not self.model:
                    raise ValueError(f"--payload: {self.net.payload}: line {i + 1} has no 'model'; give --model NAME")
                b.setdefault("model", self.model)
                b["stream"] = True
                b.setdefault("stream_options", {"include_usage": True})
                bodies.append(b)
            return bodies, self.net.payload
        rng = np.random.default_rng(self.net.seed)
        words = ("the", "model", "answer", "token", "server", "load", "latency", "stream", "time", "first",
                 "query", "batch", "fast", "slow", "inference", "request")
        count = min(self.net.sample_count, _SYNTHETIC_MAX)
        bodies = []
        for _ in range(count):
            prompt = " ".join(words[i] for i in rng.integers(0, len(words), self.net.prompt_words))
            b: Dict[str, Any] = {"model": self.model, "max_tokens": self.net.max_tokens, "stream": True,
                                 "stream_options": {"include_usage": True}}
            if chat:
                b["messages"] = [{"role": "user", "content": prompt}]
            else:
                b["prompt"] = prompt
            bodies.append(b)
        return bodies, f"synthetic ({count} prompts of {self.net.prompt_words} words, seed {self.net.seed})"

    def issue_query(self, query_id: int, sample_index: int, scheduled_ns: int) -> None:
        req = Request(self.requests[sample_index % len(self.requests)], _Stream(self, query_id, scheduled_ns),
                      query_id, True)
        self.pool.submit(req, scheduled_ns + self.timeout_ns if self.timeout_ns else 0)

    def record_stream(self, s: _Stream, t: int) -> None:
        if s.usage_tokens >= 0:
            n = s.usage_tokens
            self.tokens_from_usage += 1
        else:
            n = s.chunks
            self.tokens_from_chunks += 1
        self.output_tokens += n
        gaps = self._gaps
        gaps += s.gaps
        if len(gaps) >= 8192:
            self._flush_gaps()
        elapsed = t - s.scheduled_ns
        if elapsed > 0 and n > 0:
            self.tokens_per_s.record(max(1, round(n * 1e12 / elapsed)))
        self.sink.complete_tokens(s.query_id, t, n)

    def _flush_gaps(self) -> None:
        if self._gaps:
            self._itl.record_array(np.maximum(np.asarray(self._gaps, dtype=np.int64), 1))
            self._gaps.clear()

    @property
    def itl(self) -> Histogram:
        """Every inter-token gap so far (ns), in one histogram."""
        self._flush_gaps()
        return self._itl

    def report(self) -> Dict[str, Any]:
        out = super().report()
        u, c = self.tokens_from_usage, self.tokens_from_chunks
        out["model"] = self.model
        out["tokens"] = {
            "source": "usage" if u and not c else "chunks" if c and not u else "mixed" if u and c else "none",
            "queries_counted_from_usage": u,
            "queries_counted_from_chunks": c,
            "output_tokens": self.output_tokens,
        }
        return out


# ---------------------------------------------------------------------------- gRPC

class KServeGrpcSUT(_KServeInputs, NetworkSUT):
    """KServe v2 gRPC ``ModelInfer`` on grpcio's asyncio API; requests are serialized
    before the run and sent as bytes."""

    protocol = "kserve_v2_grpc"

    def __init__(self, target: Target, net: NetOptions, pool_size: int) -> None:
        # One HTTP/2 channel carries many concurrent calls; more channels only help at
        # very high concurrency, so the default is one per 64 in flight.
        super().__init__(target, net, max(1, math.ceil(pool_size / 64)))
        try:
            import grpc  # noqa: F401
        except ImportError:
            raise ValueError("gRPC targets need grpcio: pip install 'loadgen[grpc]'") from None
        if target.tls and net.insecure:
            raise ValueError("--insecure is not available for grpcs:// (grpcio always verifies); "
                             "give the server's CA with --ca-file")
        self.requests: List[bytes] = []
        # None rather than an empty tuple: grpc skips its metadata handling then.
        self.metadata_md = tuple((k.lower(), v) for k, v in net.headers) or None
        self._channels: list = []
        self._calls: list = []
        self.in_flight = max(1, pool_size)  # calls in flight at most: one per worker
        self._queue: collections.deque = collections.deque()
        self._idle: list = []
        self.tasks: set = set()

    def _credentials(self):
        import grpc

        if not self.target.tls:
            return None
        root = None
        if self.net.ca_file:
            try:
                with open(self.net.ca_file, "rb") as f:
                    root = f.read()
            except OSError as e:
                raise ValueError(f"--ca-file: cannot read {self.net.ca_file}: {e.strerror or e}") from None
        return grpc.ssl_channel_credentials(root_certificates=root)

    def _sync_channel(self):
        import grpc

        creds = self._credentials()
        target = host_port(self.target)
        return grpc.secure_channel(target, creds) if creds else grpc.insecure_channel(target)

    def prepare(self) -> None:
        import grpc

        from loadgen.net import grpc_v2

        channel = self._sync_channel()
        try:
            server_ready = channel.unary_unary(grpc_v2.RPC["ServerReady"],
                                               request_serializer=grpc_v2.pb.ServerReadyRequest.SerializeToString,
                                               response_deserializer=grpc_v2.pb.ServerReadyResponse.FromString)
            model_ready = channel.unary_unary(grpc_v2.RPC["ModelReady"],
                                              request_serializer=grpc_v2.pb.ModelReadyRequest.SerializeToString,
                                              response_deserializer=grpc_v2.pb.ModelReadyResponse.FromString)
            metadata = channel.unary_unary(grpc_v2.RPC["ModelMetadata"],
                                           request_serializer=grpc_v2.pb.ModelMetadataRequest.SerializeToString,
                                           response_deserializer=grpc_v2.pb.ModelMetadataResponse.FromString)
            name, version = self.target.model, self.target.version

            def probe(timeout_s: float):
                try:
                    if not server_ready(grpc_v2.pb.ServerReadyRequest(), timeout=timeout_s,
                                        metadata=self.metadata_md).ready:
                        return False, "ServerReady: not ready"
                    if not model_ready(grpc_v2.pb.ModelReadyRequest(name=name, version=version),
                                       timeout=timeout_s, metadata=self.metadata_md).ready:
                        return False, f"ModelReady({name!r}): not ready"
                    return True, ""
                except grpc.RpcError as e:
                    return False, f"{e.code().name}: {e.details()}"

            self._wait_ready(probe, f"gRPC server {host_port(self.target)}")
            try:
                self.metadata = grpc_v2.metadata_from_pb(metadata(
                    grpc_v2.pb.ModelMetadataRequest(name=name, version=version), timeout=10.0,
                    metadata=self.metadata_md))
            except grpc.RpcError as e:
                if not self.net.inputs and not self.net.payload:
                    raise ValueError(f"ModelMetadata({name!r}) failed ({e.code().name}: {e.details()}); "
                                     "give --input NAME:DTYPE:SHAPE or --payload FILE") from None
        finally:
            channel.close()
        self.expected = self.expected_outputs()
        if self.net.payload and _payload_kind(self.net.payload) == "jsonl":
            bodies = _read_jsonl(self.net.payload)[: self.net.sample_count]
            samples = [_samples_from_kserve_json(b, f"--payload {self.net.payload} line {i + 1}")
                       for i, b in enumerate(bodies)]
            specs = [InputSpec(k, _datatype_of(v), tuple(v.shape)) for k, v in samples[0].items()]
            source = self.net.payload
        else:
            samples, specs, source = self.samples()
        self.requests = [grpc_v2.infer_request(name, version, s, specs, self.net.grpc_contents).SerializeToString()
                         for s in samples]
        self.payload_bytes = [len(r) for r in self.requests]
        self.payload_source = source + f" ({self.net.grpc_contents} contents)"

    async def open_on_loop(self, loop, sink) -> None:
        import grpc

        from loadgen.net import grpc_v2

        self.loop, self.sink = loop, sink
        creds = self._credentials()
        target = host_port(self.target)
        # No retries: a load generator counts a failed call, it does not hide it, and
        # the retry machinery costs CPU on every call.
        options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1),
                   ("grpc.use_local_subchannel_pool", 1), ("grpc.enable_retries", 0)]
        for _ in range(self.connections):
            ch = (grpc.aio.secure_channel(target, creds, options=options) if creds
                  else grpc.aio.insecure_channel(target, options=options))
            self._channels.append(ch)
            self._calls.append(ch.unary_unary(grpc_v2.RPC["ModelInfer"]))
        self._decode = grpc_v2.pb.ModelInferResponse.FromString
        self._check = grpc_v2.check_response
        self._rpc_error = grpc.aio.AioRpcError
        self._deadline_exceeded = grpc.StatusCode.DEADLINE_EXCEEDED
        for i in range(self.in_flight):
            self.tasks.add(loop.create_task(self._worker(self._calls[i % len(self._calls)])))

    async def close_on_loop(self) -> None:
        for t in list(self.tasks):
            t.cancel()
        for ch in self._channels:
            await ch.close(None)

    def issue_query(self, query_id: int, sample_index: int, scheduled_ns: int) -> None:
        self._queue.append((query_id, self.requests[sample_index % len(self.requests)], scheduled_ns))
        if self._idle:
            waiter = self._idle.pop()
            if not waiter.done():
                waiter.set_result(None)

    async def _worker(self, call) -> None:
        # Long-lived workers instead of a task per call: in a closed loop the worker that
        # completes a query finds the next one queued by that completion and goes on with
        # no task, future or wake-up in between.
        queue, idle, one = self._queue, self._idle, self._one
        while True:
            if not queue:
                waiter = self.loop.create_future()
                idle.append(waiter)
                await waiter
                continue
            qid, data, scheduled_ns = queue.popleft()
            await one(call, qid, data, scheduled_ns)

    def _check_pb(self, raw: bytes) -> Optional[str]:
        try:
            return self._check(self._decode(raw), self.expected)
        except Exception as e:  # protobuf's DecodeError and friends
            return f"the response does not decode: {type(e).__name__}: {e}"

    async def _one(self, call, qid: int, data: bytes, scheduled_ns: int) -> None:
        timeout = None
        if self.timeout_ns:
            timeout = max((scheduled_ns + self.timeout_ns - _monotonic_ns()) / 1e9, 0.0)
        try:
            raw = await call(data, timeout=timeout, metadata=self.metadata_md)
        except self._rpc_error as e:
            if e.code() != self._deadline_exceeded or not self.timeout_ns:
                self._fail(qid, f"grpc_{e.code().name}", e.details() or e.code().name)
            return  # a deadline the timeout set: the engine counts it as timed out
        t = _monotonic_ns()
        if self.check:
            problem = self._checked(raw, self._check_pb)
            if problem is not None:
                self._fail(qid, "invalid_response", problem)
                return
        self.sink.complete(qid, t)


# ------------------------------------------------------------------------------ entry

def open_target(url: str, net: NetOptions, *, pool_size: int, significant_figures: int = 3) -> NetworkSUT:
    """The prepared network SUT for a ``--sut`` URL: ready server, serialized requests.

    Args:
        url: the ``--sut`` value.
        net: the client options.
        pool_size: connections (HTTP) to open when ``net.connections`` is 0: the load's
            concurrency or in-flight cap.

    Raises:
        ValueError: bad URL or options, server not ready in time, payload that does not fit.
    """
    from loadgen.net.targets import parse_target

    target = parse_target(url, template=bool(net.request_template))
    if net.request_template and target.kind != "template":
        raise ValueError(f"--request-template applies to http(s) URLs, not {target.kind} targets")
    if target.kind == "kserve_http":
        sut: NetworkSUT = KServeHttpSUT(target, net, pool_size)
    elif target.kind == "template":
        sut = TemplateHttpSUT(target, net, pool_size)
    elif target.kind == "openai":
        sut = OpenAISUT(target, net, pool_size, significant_figures)
    else:
        sut = KServeGrpcSUT(target, net, pool_size)
    sut.prepare()
    return sut
