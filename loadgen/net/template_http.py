"""Any JSON API over HTTP, described by a ``--request-template`` file: the request's
method, path, headers and body with ``{{sample}}`` placeholders, and what a response must
hold."""

from __future__ import annotations

import json
import re
import socket
from typing import Any, List, Optional, Tuple

import numpy as np

from loadgen.net.base import HttpSUT
from loadgen.net.payloads import SYNTHETIC_MAX, payload_kind, read_jsonl
from loadgen.net.tensors import load_samples, synthetic_samples, synthetic_source

__all__ = ["TemplateHttpSUT", "fill_template"]

_PLACEHOLDER = re.compile(r"\{\{\s*(sample(?:\.[A-Za-z0-9_\-]+)?|sample_index)\s*\}\}")


class TemplateHttpSUT(HttpSUT):
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
        if path is None:  # a template target is only chosen with --request-template
            raise ValueError("--request-template: a template target needs a request template file")
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
                body = json.dumps(fill_template(body_tpl, sample, i), separators=(",", ":")).encode()
            requests.append(self._serialize(method, req_path, body, header_items))
        self._set_requests(requests, source)

    def _ready_probe(self, ready_path: Optional[str]):
        host, port = self.target.host, self.target.port

        def probe(timeout_s: float):
            if ready_path:
                status, _, problem = self._get(str(ready_path), timeout_s)
                return 200 <= status < 300, f"GET {ready_path}: {problem or status}"
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
            kind = payload_kind(path)
            if kind == "jsonl":
                return read_jsonl(path)[:limit], path
            samples = load_samples(path, list(self.net.inputs) or None, limit)
            values = [{k: np.asarray(v).tolist() for k, v in s.items()} for s in samples]
            if kind == "npy":
                values = [next(iter(v.values())) for v in values]
            return values, path
        if self.net.inputs:
            count = min(limit, SYNTHETIC_MAX)
            samples = synthetic_samples(self.net.inputs, count, self.net.seed)
            source = synthetic_source(len(samples), count, self.net.seed)
            values = [{k: np.asarray(v).tolist() for k, v in s.items()} for s in samples]
            if len(self.net.inputs) == 1:
                values = [next(iter(v.values())) for v in values]
            return values, source
        if uses_sample:
            raise ValueError("--request-template uses {{sample}} but there is no --payload FILE or --input spec")
        return [None], "template only"

    def verdict(self, status: int, body: bytes) -> Optional[Tuple[str, str]]:
        """None for a good response, else its error (kind, message): a function of the
        response's bytes alone, which the native client caches by them."""
        ok = status in self.ok_status if self.ok_status is not None else 200 <= status < 300
        if not ok:
            return f"http_{status}", f"HTTP {status}: {self.redactor.excerpt(body, 200)}"
        if self.check and self.json_keys:
            self.checked += 1
            try:
                doc = json.loads(body)
            except (ValueError, UnicodeDecodeError, RecursionError):
                return "invalid_response", f"the response is not JSON: {self.redactor.excerpt(body, 80)!r}"
            missing = [k for k in self.json_keys if not isinstance(doc, dict) or doc.get(k) in (None, [], {}, "")]
            if missing:
                return "invalid_response", f"the response has no (or an empty) {missing[0]!r}"
        return None



def fill_template(node: Any, sample: Any, index: int) -> Any:
    """The template ``node`` with its placeholders filled by ``sample`` (the sample at
    ``index``); ValueError for a ``{{sample.KEY}}`` the sample lacks."""
    if isinstance(node, dict):
        return {k: fill_template(v, sample, index) for k, v in node.items()}
    if isinstance(node, list):
        return [fill_template(v, sample, index) for v in node]
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
