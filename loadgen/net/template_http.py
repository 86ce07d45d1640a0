"""Any JSON API over HTTP, described by a ``--request-template`` file: the request's
method, path, headers and body with ``{{sample}}`` placeholders, and what a response must
hold."""

from __future__ import annotations

import json
import re
import socket
from typing import Any, Dict, FrozenSet, List, Optional, Tuple

import numpy as np

from loadgen.files import TEMPLATE_LIMIT_BYTES, read_text
from loadgen.net.base import HttpSUT
from loadgen.net.options import header_problem, redact_query
from loadgen.net.payloads import SYNTHETIC_MAX, payload_kind, read_jsonl
from loadgen.net.tensors import load_samples, synthetic_samples, synthetic_source

__all__ = ["TemplateHttpSUT", "fill_template", "load_template"]

_KEYS = ("method", "path", "headers", "body", "ready_path", "check")
_CHECK_KEYS = ("status", "json_keys")
_METHOD = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an RFC 9110 token
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
        tpl = load_template(path, self.target.path)
        method, req_path = tpl["method"], tpl["path"]
        self.head_only = method == "HEAD"
        self.ok_status = tpl["status"]
        self.json_keys = tpl["json_keys"]
        ready_path = tpl["ready_path"]
        self.wait_ready(self._ready_probe(ready_path), f"server {self.target.http_base}")
        body_tpl = tpl["body"]
        uses_sample = body_tpl is not None and "{{" in json.dumps(body_tpl) and "sample" in json.dumps(body_tpl)
        samples, source = self._template_samples(uses_sample)
        header_items = tpl["headers"]
        requests = []
        for i, sample in enumerate(samples):
            body = None
            if body_tpl is not None:
                body = json.dumps(fill_template(body_tpl, sample, i), separators=(",", ":")).encode()
            requests.append(self.serialize(method, req_path, body, header_items))
        self.set_requests(requests, source)

    def _ready_probe(self, ready_path: Optional[str]):
        host, port = self.target.host, self.target.port

        def probe(timeout_s: float):
            if ready_path:
                status, _, problem = self.get_path(str(ready_path), timeout_s)
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


def load_template(path: str, default_path: str = "/") -> Dict[str, Any]:
    """The ``--request-template`` file ``path`` read and checked: ``method`` (upper
    case), ``path`` (default ``default_path``, the URL's), ``headers`` as (name, value)
    text, ``body`` (None without one), ``ready_path`` (None without one), ``status`` (a
    frozenset of the statuses that pass, None for any 2xx) and ``json_keys``.

    Raises:
        ValueError: the file cannot be read, is not JSON, or a field is wrong; one line
            naming the file and the field (never a header's value).
    """
    where = f"--request-template {path}"
    text = read_text(path, what="--request-template", limit_bytes=TEMPLATE_LIMIT_BYTES)
    try:
        tpl = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{where}: not JSON: {e}") from None
    if not isinstance(tpl, dict):
        raise ValueError(f"{where}: must be a JSON object (with method, path, headers, body, ...)")
    unknown = set(tpl) - set(_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))} "
                         f"(known: {', '.join(_KEYS)})")
    method = tpl.get("method", "POST" if "body" in tpl else "GET")
    if not isinstance(method, str) or not _METHOD.match(method):
        raise ValueError(f"{where}: method must be an HTTP method (a word like POST, without spaces or "
                         f"control characters), got {_shown(method)}")
    req_path = _request_path(tpl.get("path", default_path), where, "path")
    ready_path = tpl.get("ready_path")
    if ready_path is not None:
        ready_path = _request_path(ready_path, where, "ready_path")
    headers = tpl.get("headers")
    if headers is None:
        headers = {}
    if not isinstance(headers, dict):
        raise ValueError(f"{where}: headers must be an object of \"Name\": \"value\" pairs")
    header_items: List[Tuple[str, str]] = []
    for name, value in headers.items():
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            shown = repr(name) if _METHOD.match(name) else "a header"
            raise ValueError(f"{where}: headers: {shown}: the value must be text or a number, "
                             f"not {type(value).__name__}")
        problem = header_problem(name.strip(), str(value))
        if problem:
            raise ValueError(f"{where}: headers: {problem}")
        header_items.append((name.strip(), str(value).strip()))
    status, json_keys = _check(tpl.get("check"), where)
    return {"method": method.upper(), "path": req_path, "headers": header_items, "body": tpl.get("body"),
            "ready_path": ready_path, "status": status, "json_keys": json_keys}


def _shown(value: Any) -> str:
    """A template value for a message: cut short, secret query values redacted."""
    text = repr(value)
    return redact_query(text if len(text) <= 80 else text[:77] + "...")


def _request_path(value: Any, where: str, field: str) -> str:
    """A request path of the template: text starting with '/', without spaces or control
    characters (a space or CR/LF would split the request line)."""
    if not isinstance(value, str):
        raise ValueError(f"{where}: {field} must be text like \"/v1/predict\", got {type(value).__name__}")
    if not value.startswith("/"):
        raise ValueError(f"{where}: {field} must start with '/', got {_shown(value)}")
    bad = next((c for c in value if c == " " or ord(c) < 0x20 or ord(c) == 0x7F), None)
    if bad is not None:
        what = "a space" if bad == " " else f"a control character ({bad!r})"
        raise ValueError(f"{where}: {field} holds {what}; percent-encode it (a space is %20)")
    try:
        value.encode("ascii")
    except UnicodeEncodeError:
        raise ValueError(f"{where}: {field} holds a character that is not ASCII; percent-encode it") from None
    return value


def _check(check: Any, where: str) -> Tuple[Optional[FrozenSet[int]], List[str]]:
    """The ``check`` object: (statuses that pass, None for any 2xx; JSON keys)."""
    if check is None:
        return None, []
    if not isinstance(check, dict):
        raise ValueError(f"{where}: check must be an object like {{\"status\": [200], \"json_keys\": "
                         f"[\"predictions\"]}}, got {type(check).__name__}")
    unknown = set(check) - set(_CHECK_KEYS)
    if unknown:
        raise ValueError(f"{where}: check: unknown key(s) {', '.join(sorted(map(str, unknown)))} "
                         f"(known: {', '.join(_CHECK_KEYS)})")
    raw = check.get("status")
    statuses: Optional[FrozenSet[int]] = None
    if raw is not None:
        items = raw if isinstance(raw, list) else [raw]
        for s in items:
            if isinstance(s, bool) or not isinstance(s, int) or not 100 <= s <= 599:
                raise ValueError(f"{where}: check.status must be an HTTP status (an integer 100..599) or a list "
                                 f"of them, got {_shown(s)}")
        if not items:
            raise ValueError(f"{where}: check.status is an empty list (leave it out for any 2xx)")
        statuses = frozenset(items)
    keys = check.get("json_keys", [])
    if isinstance(keys, str) or not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
        raise ValueError(f"{where}: check.json_keys must be a list of key names (text), got {_shown(keys)}")
    return statuses, list(keys)


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
