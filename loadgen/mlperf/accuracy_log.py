"""Writes ``mlperf_log_accuracy.json`` as MLPerf LoadGen does."""

from __future__ import annotations

import threading
from typing import IO

__all__ = ["AccuracyLog"]

class AccuracyLog:
    """Writes ``mlperf_log_accuracy.json``: a JSON list with one entry per logged response.

    Entries read ``{ "seq_id" : 0, "qsl_idx" : 5, "data" : "05AB" }``, one per line, the
    data in upper-case hex; token runs add ``"token_count"`` and, outside Offline,
    ``"token_data"`` (the first-token response) before it. With no entry the file is
    ``[`` and ``]`` on two lines. Thread-safe.

    Args:
        fh: text stream to write to; "[" is written at once.
        use_tokens: the run reports output token counts (``use_token_latencies``).
        needs_first_token: token runs other than Offline also log the first token.
    """

    def __init__(self, fh: IO[str], *, use_tokens: bool = False, needs_first_token: bool = False) -> None:
        self._fh = fh
        self.use_tokens = use_tokens
        self.needs_first_token = needs_first_token
        self._lock = threading.Lock()
        self._needs_comma = False
        self._closed = False
        self.count = 0
        fh.write("[")

    def add(
        self,
        seq_id: int,
        qsl_idx: int,
        data: bytes,
        *,
        token_count: int = 0,
        token_data: bytes | None = None,
    ) -> None:
        """Appends one response.

        Args:
            seq_id: the sample's sequence id.
            qsl_idx: the sample's index in the QSL.
            data: the response bytes.
            token_count: output tokens (token runs only).
            token_data: the first-token response (token runs outside Offline).
        """
        fields = f'"seq_id" : {int(seq_id)}, "qsl_idx" : {int(qsl_idx)}, "data" : "{bytes(data).hex().upper()}"'
        if self.use_tokens:
            if self.needs_first_token:
                hex_first = bytes(token_data).hex().upper() if token_data is not None else ""
                fields += f', "token_data" : "{hex_first}"'
            fields += f', "token_count" : {int(token_count)}'
        with self._lock:
            if self._closed:
                raise ValueError("the accuracy log is closed")
            self._fh.write((",\n{ " if self._needs_comma else "\n{ ") + fields + " }")
            self._needs_comma = True
            self.count += 1

    def close(self) -> None:
        """Ends the JSON list (idempotent); the caller closes the stream."""
        with self._lock:
            if not self._closed:
                self._fh.write("\n]\n")
                self._closed = True
                self._fh.flush()

