"""KServe v2 over REST: ``POST /v2/models/NAME[/versions/V]/infer`` with JSON tensors,
every response's outputs checked against the model's metadata."""

from __future__ import annotations

import json
from typing import Optional, Tuple

from loadgen.net.base import HttpSUT
from loadgen.net.kserve_common import KServeInputs, check_json_response, json_request_body, parse_metadata
from loadgen.net.payloads import payload_kind, raw_lines, read_jsonl
from loadgen.net.targets import model_path

__all__ = ["KServeHttpSUT"]


class KServeHttpSUT(KServeInputs, HttpSUT):
    """KServe v2 REST: ``POST /v2/models/NAME[/versions/V]/infer`` with JSON tensors."""

    protocol = "kserve_v2_http"

    def prepare(self) -> None:
        base = self.target.http_base

        def probe(timeout_s: float):
            status, _, problem = self.get_path("/v2/health/ready", timeout_s)
            if status != 200:
                return False, f"GET {base}/v2/health/ready: {problem or status}"
            status, _, problem = self.get_path(model_path(self.target) + "/ready", timeout_s)
            if status != 200:
                return False, f"model {self.target.model!r} not ready: GET {model_path(self.target)}/ready: {problem or status}"
            return True, ""

        self.wait_ready(probe, f"KServe server {base}")
        status, body, problem = self.get_path(model_path(self.target), 10.0)
        if status == 200:
            try:
                self.metadata = parse_metadata(json.loads(body))
            except ValueError as e:
                raise ValueError(f"GET {base}{model_path(self.target)}: {e}") from None
        elif not self.net.inputs and not self.net.payload:
            raise ValueError(f"GET {base}{model_path(self.target)} answered {problem or status}; "
                             "give --input NAME:DTYPE:SHAPE or --payload FILE")
        self.expected = self.expected_outputs()
        path = self.target.path
        if self.net.payload and payload_kind(self.net.payload) == "jsonl":
            bodies = read_jsonl(self.net.payload)[: self.net.sample_count]
            if any(isinstance(b, dict) and b.get("outputs") for b in bodies):
                self.expected = []  # the requests choose their outputs
            raw = raw_lines(self.net.payload, len(bodies))
            self.set_requests([self.serialize("POST", path, line) for line in raw], self.net.payload)
            return
        samples, specs, source = self.samples()
        self.set_requests([self.serialize("POST", path, json_request_body(s, specs)) for s in samples],
                           source)

    def _check_json(self, body: bytes) -> Optional[str]:
        return check_json_response(body, self.expected)

    def verdict(self, status: int, body: bytes) -> Optional[Tuple[str, str]]:
        """None for a good response, else its error (kind, message): a function of the
        response's bytes alone, which the native client caches by them."""
        if status != 200:
            return f"http_{status}", f"HTTP {status}: {self.redactor.excerpt(body, 200)}"
        if self.check:
            problem = self.check_body(body, self._check_json)
            if problem is not None:
                return "invalid_response", problem
        return None

