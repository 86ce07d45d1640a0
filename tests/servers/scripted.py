#!/usr/bin/env python3
"""A scripted HTTP/1.1 server for the integration tests: exact timing, injected faults.

``python tests/servers/scripted.py --port 0 [options]`` binds 127.0.0.1, prints one line
``PORT <n>`` once listening, and serves until SIGTERM/SIGINT or --max-runtime-s. With
--tls-cert and --tls-key it serves HTTPS (ALPN http/1.1), with the same timing.

Endpoints (keep-alive HTTP/1.1, Content-Length request bodies):
  POST /v1/completions, /v1/chat/completions  OpenAI style; Server-Sent Events (chunked)
                                              when the body has "stream": true
  POST /v1/responses                          OpenAI Responses API: typed Server-Sent Events
                                              when "stream": true, else one response object
  POST /v1/embeddings                         OpenAI style; one 8-float embedding per input
  GET  /v1/models                             lists the model "scripted"
  GET  /v2/health/live, /v2/health/ready      KServe v2; ready answers 503 until --ready-after-s
  GET  /v2/models/{name}, /v2/models/{name}/ready
  POST /v2/models/{name}/infer                OUTPUT0 = INPUT0 + 1, subject to the fault options
  GET  /metrics                               Prometheus text: request/response counters, inflight
  GET  /stats                                 JSON record of what was sent and when (the truth);
                                              each chat request's image parts as they arrived

Timing: token i of an answer is due at recv + ttft + i * itl on time.monotonic_ns(), recv
being when the kernel received the request's last bytes (SO_TIMESTAMPNS, converted to the
monotonic clock), however busy the server was then. A stream event carries --tokens-per-chunk
tokens (the first one --first-chunk-tokens) and is written when its last token is due; a
non-streamed answer when its last token is due. With --reasoning-tokens R a chat stream's
first R tokens are reasoning (``delta.reasoning_content``, or --reasoning-field's name) and
the rest the answer (``delta.content``); an event holds one kind only (the one that would
straddle R is cut there), and the usage chunk says R as
``completion_tokens_details.reasoning_tokens`` (as a non-streamed chat answer's usage does).
/v1/responses answers the same way in its own events (``response.reasoning_text.delta``,
``response.output_text.delta``, then ``response.output_text.done`` and
``response.completed`` with ``usage.output_tokens``, ``output_tokens_details`` and, with
--prefix-cache, ``input_tokens_details``), each event written when its last token is due.
With --tool-calls N a chat or responses request that carries ``tools`` and whose last
message is not a tool result (chat: ``role: "tool"``; responses: a
``function_call_output`` item) is answered with N calls of its first tool instead of
text: the answer tokens are the calls' arguments (`` tok`` each), spread over the calls
(chat: ``delta.tool_calls``, finish_reason ``tool_calls``; responses:
``response.output_item.added`` of a ``function_call`` item and
``response.function_call_arguments.delta``); call j's id is ``call_<j>``.
Each event's write is a timer callback at its absolute due time (no busy waiting), and
/stats records the time taken right before the write: the data reaches the client during
the send() call, and a client woken by it may preempt the server before send() returns.

The event loop is asyncio's with a select() selector, whose waits have microsecond
resolution; epoll (asyncio's default) and libuv (uvloop) round every wait to whole
milliseconds, so their timers fire up to 1-2 ms late (uvloop's also up to 1 ms early).
select() limits the server to file descriptors below 1024, plenty for tests; ``--selector
epoll`` lifts that limit (for benchmarks with thousands of streams), at the cost of timers
up to 1 ms late (the record still holds each write's real time).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import bisect
import ctypes
import hashlib
import json
import os
import platform
import selectors
import signal
import socket
import ssl
import struct
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from http import HTTPStatus
from typing import Any

MS = 1_000_000  # nanoseconds


@dataclass
class Request:
    method: str
    path: str
    body: bytes
    keep_alive: bool
    recv_ns: int  # time.monotonic_ns() once the whole request was read


@dataclass
class StreamRecord:
    """One streamed answer as sent: the truth that tests compare a client's view with."""

    recv_ns: int
    tokens: int
    tokens_per_event: int
    first_event_tokens: int  # the first event's tokens; then tokens_per_event each
    reasoning_tokens: int = 0  # the first ones (chat): an event holds one kind only
    tool_calls: int = 0  # the answer's tool calls (--tool-calls)
    token_write_ns: list[int] = field(default_factory=list)  # one per token event
    usage_sent: bool = False


def chunk(data: bytes) -> bytes:
    """data as one chunk of a chunked transfer coding."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def sse(obj: Any) -> bytes:
    """obj as one Server-Sent Event in one chunk."""
    return chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


def flat(x: Any) -> list[Any]:
    """The values of a nested list, in order."""
    return [z for y in x for z in flat(y)] if isinstance(x, list) else [x]


def words(x: Any) -> int:
    """Prompt size in tokens: whitespace-separated words of the texts in x, one per token id."""
    if isinstance(x, str):
        return len(x.split())
    if isinstance(x, list):
        return sum(words(v) for v in x)
    if isinstance(x, dict):
        return words(x.get("text", ""))
    return int(isinstance(x, int))


def _messages(body: dict[str, Any], responses: bool) -> list[dict[str, Any]]:
    """A chat request's messages, or a responses request's input as a message list."""
    given = body.get("input") if responses else body.get("messages", [])
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    return [m for m in given or [] if isinstance(m, dict)]


def _tool_result(messages: list[dict[str, Any]]) -> bool:
    """Whether the last message is a tool call's result (chat or responses)."""
    last = messages[-1] if messages else {}
    return last.get("role") == "tool" or last.get("type") == "function_call_output"


def _first_tool(body: dict[str, Any]) -> str:
    """The name of a request's first tool (either form)."""
    tool = (body.get("tools") or [{}])[0]
    return str(tool.get("name") or (tool.get("function") or {}).get("name") or "tool")


@dataclass
class Answer:
    """What one answer holds: n tokens, the first ``reasoning`` of them reasoning, the rest
    text, or (``calls`` > 0) the arguments of that many calls of ``tool``, spread evenly;
    in the form of chat (else completions) or of the Responses API."""

    n: int
    reasoning: int
    calls: int
    tool: str
    chat: bool
    responses: bool

    def __post_init__(self) -> None:
        self.calls = min(self.calls, self.n - self.reasoning)

    def call_range(self, j: int) -> tuple[int, int]:
        m = self.n - self.reasoning
        return self.reasoning + j * m // self.calls, self.reasoning + (j + 1) * m // self.calls

    def call_starts(self) -> list[int]:
        return [self.call_range(j)[0] for j in range(self.calls)]

    def kind_at(self, start: int) -> int:
        """-1: reasoning; 0: text; j + 1: call j's arguments."""
        if start < self.reasoning:
            return -1
        if not self.calls:
            return 0
        return next(j for j in range(self.calls) if start < self.call_range(j)[1]) + 1

    def starts_part(self, start: int) -> bool:
        return start == 0 or (self.calls > 0 and start in self.call_starts())

    def event(self, base: dict[str, Any], count: int, start: int, reasoning_field: str) -> bytes:
        """The event of ``count`` tokens from token ``start`` on."""
        text = " tok" * count
        kind, first = self.kind_at(start), self.starts_part(start)
        if self.responses:
            if kind <= 0:
                what, item = ("reasoning_text", "rs_0") if kind < 0 else ("output_text", "msg_0")
                return sse({"type": f"response.{what}.delta", "item_id": item, "output_index": int(kind == 0 and
                            self.reasoning > 0), "content_index": 0, "delta": text})
            j = kind - 1
            added = sse({"type": "response.output_item.added", "output_index": j, "item": {
                "type": "function_call", "id": f"fc_{j}", "call_id": f"call_{j}", "name": self.tool,
                "arguments": "", "status": "in_progress"}}) if first else b""
            return added + sse({"type": "response.function_call_arguments.delta", "item_id": f"fc_{j}",
                                "output_index": j, "delta": text})
        if not self.chat:
            return sse({**base, "choices": [{"index": 0, "text": text, "finish_reason": None}]})
        delta: dict[str, Any] = {"role": "assistant"} if start == 0 else {}
        if kind > 0:
            j = kind - 1
            call: dict[str, Any] = {"index": j, "function": {"arguments": text}}
            if first:
                call = {"index": j, "id": f"call_{j}", "type": "function",
                        "function": {"name": self.tool, "arguments": text}}
            delta["tool_calls"] = [call]
        elif count:
            delta[reasoning_field if kind < 0 else "content"] = text
        return sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})

    def head(self, base: dict[str, Any]) -> bytes:
        """What a stream starts with before its first token (responses: response.created)."""
        if not self.responses:
            return b""
        return sse({"type": "response.created", "sequence_number": 0,
                    "response": {**base, "status": "in_progress", "output": [], "usage": None}})

    def tail(self, base: dict[str, Any], usage: dict[str, Any] | None) -> bytes:
        """What follows the last token's event: the finish, the usage and the stream's end."""
        if self.responses:
            out = b""
            if self.calls:
                for j in range(self.calls):
                    lo, hi = self.call_range(j)
                    out += sse({"type": "response.function_call_arguments.done", "item_id": f"fc_{j}",
                                "output_index": j, "arguments": " tok" * (hi - lo)})
            elif self.n > self.reasoning:
                out += sse({"type": "response.output_text.done", "item_id": "msg_0", "content_index": 0,
                            "text": " tok" * (self.n - self.reasoning)})
            done = {**base, "status": "completed", "output": self.output_items(), "usage": usage}
            return out + sse({"type": "response.completed", "response": done}) + b"0\r\n\r\n"
        finish = "tool_calls" if self.calls else "length"
        last = ({"index": 0, "delta": {}, "finish_reason": finish} if self.chat
                else {"index": 0, "text": "", "finish_reason": finish})
        return (sse({**base, "choices": [last]}) + (sse({**base, "choices": [], "usage": usage}) if usage else b"")
                + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")

    def output_items(self) -> list[dict[str, Any]]:
        """A responses answer's output items."""
        items: list[dict[str, Any]] = []
        if self.reasoning:
            items.append({"type": "reasoning", "id": "rs_0", "summary": [],
                          "content": [{"type": "reasoning_text", "text": " tok" * self.reasoning}]})
        for j in range(self.calls):
            lo, hi = self.call_range(j)
            items.append({"type": "function_call", "id": f"fc_{j}", "call_id": f"call_{j}", "name": self.tool,
                          "arguments": " tok" * (hi - lo), "status": "completed"})
        if not self.calls:
            items.append({"type": "message", "id": "msg_0", "role": "assistant", "status": "completed",
                          "content": [{"type": "output_text", "text": " tok" * (self.n - self.reasoning),
                                       "annotations": []}]})
        return items

    def whole(self, base: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
        """The answer not streamed."""
        if self.responses:
            return {**base, "status": "completed", "error": None, "output": self.output_items(), "usage": usage}
        if not self.chat:
            return {**base, "choices": [{"index": 0, "text": " tok" * self.n, "finish_reason": "length"}],
                    "usage": usage}
        message: dict[str, Any] = {"role": "assistant", "content": " tok" * self.n}
        if self.calls:
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{j}", "type": "function", "function": {
                    "name": self.tool, "arguments": " tok" * (self.call_range(j)[1] - self.call_range(j)[0])}}
                for j in range(self.calls)]}
        return {**base, "choices": [{"index": 0, "message": message,
                                     "finish_reason": "tool_calls" if self.calls else "length"}], "usage": usage}
def image_parts(messages: Any) -> list[dict[str, Any]]:
    """The image parts of chat messages, in order: each one's MIME type, its decoded
    bytes' count and SHA-256 (what arrived, for a test to compare with what was sent);
    a part that is no base64 data URL is recorded with its error."""
    out: list[dict[str, Any]] = []
    for m in messages if isinstance(messages, list) else ():
        content = m.get("content") if isinstance(m, dict) else None
        for part in content if isinstance(content, list) else ():
            if not isinstance(part, dict) or part.get("type") != "image_url":
                continue
            url = str((part.get("image_url") or {}).get("url", ""))
            head, _, data = url.partition(",")
            if not (head.startswith("data:") and head.endswith(";base64")):
                out.append({"error": f"not a base64 data URL: {url[:40]!r}"})
                continue
            try:
                raw = base64.b64decode(data, validate=True)
            except ValueError as e:
                out.append({"error": f"bad base64: {e}"})
                continue
            out.append({"mime": head[5:-7], "bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()})
    return out


async def sleep_until(due_ns: int) -> None:
    await asyncio.sleep(max(0, due_ns - time.monotonic_ns()) / 1e9)


SO_TIMESTAMPNS = 35  # Linux: the kernel stamps each received packet (CLOCK_REALTIME)
MAX_HEAD_BYTES = 1 << 16


def _kernel_recv_ns(ancillary: list[tuple[int, int, bytes]]) -> int:
    """When the kernel received the data, on time.monotonic_ns()'s clock; now when the
    kernel gave no stamp."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
            sec, nsec = struct.unpack("qq", data[:16])
            offset = time.clock_gettime_ns(time.CLOCK_REALTIME) - time.monotonic_ns()
            return sec * 1_000_000_000 + nsec - offset
    return time.monotonic_ns()


class Connection:
    """One accepted connection, read with recvmsg() so that each request carries the
    kernel's receive time of its last bytes. A server busy writing other streams reads a
    new request late; the kernel's stamp is when it really arrived, and a request's due
    times count from there. Offers the parts of asyncio's StreamWriter the handlers use
    (write, drain, close, transport.write, transport.is_closing)."""

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        self.sock, self.loop = sock, loop
        self.transport = self
        self.requests: asyncio.Queue[Request | None] = asyncio.Queue()
        self._buf = bytearray()
        self._out = bytearray()
        self._drained = asyncio.Event()
        self._drained.set()
        self.closed = False
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError:
            pass
        loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            data, ancillary, _, _ = self.sock.recvmsg(1 << 16, 256)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, ancillary = b"", []
        if not data:
            self.close()
            return
        self._got(data, _kernel_recv_ns(ancillary))

    def _got(self, data: bytes, recv_ns: int) -> None:
        """Bytes read, received by the kernel at ``recv_ns``: the requests they complete."""
        self._buf += data
        while (req := self._parse(recv_ns)) is not None:
            self.requests.put_nowait(req)

    def _parse(self, recv_ns: int) -> Request | None:
        buf = self._buf
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD_BYTES:
                self.close()
            return None
        try:
            lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
            method, target, version = lines[0].split(" ")
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
            length = int(headers.get("content-length", "0"))
        except ValueError:
            self.close()
            return None
        if len(buf) < end + 4 + length:
            return None
        body = bytes(buf[end + 4:end + 4 + length])
        del buf[:end + 4 + length]
        connection = headers.get("connection", "").lower()
        keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
        return Request(method, target.partition("?")[0], body, keep_alive, recv_ns)

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        if not self._out:
            try:
                sent = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self.close()
                return
            if sent == len(data):
                return
            data = data[sent:]
            self._drained.clear()
            self.loop.add_writer(self.sock.fileno(), self._writable)
        self._out += data

    def _writable(self) -> None:
        try:
            sent = self.sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        del self._out[:sent]
        if not self._out:
            self.loop.remove_writer(self.sock.fileno())
            self._drained.set()

    async def drain(self) -> None:
        await self._drained.wait()

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.loop.remove_reader(self.sock.fileno())
        if self._out:
            self.loop.remove_writer(self.sock.fileno())
        self._drained.set()
        self.sock.close()
        self.requests.put_nowait(None)


class TlsConnection(Connection):
    """A :class:`Connection` over TLS (``--tls-cert``, ``--tls-key``): the same reads
    with the kernel's receive stamps, decrypted by an ``ssl.SSLObject`` on memory BIOs;
    what it writes (the handshake's answers, session tickets, responses) goes out
    through the plain connection's buffered writes."""

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop, context: ssl.SSLContext) -> None:
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._handshaken = False
        super().__init__(sock, loop)

    def _got(self, data: bytes, recv_ns: int) -> None:
        self._incoming.write(data)
        plain = bytearray()
        try:
            if not self._handshaken:
                self._tls.do_handshake()
                self._handshaken = True
            while True:
                plain += self._tls.read(1 << 16)
        except ssl.SSLWantReadError:
            pass
        except (ssl.SSLZeroReturnError, ssl.SSLError):  # the client's close_notify, or its refusal
            self._flush()
            self.close()
            return
        self._flush()
        super()._got(bytes(plain), recv_ns)

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        self._tls.write(data)
        self._flush()

    def _flush(self) -> None:
        out = self._outgoing.read()
        if out:
            Connection.write(self, out)


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    """The server's TLS context: its certificate chain and key (PEM), ALPN http/1.1."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["http/1.1"])
    return context


class ScriptedServer:
    """The endpoints, the fault plan and the record of what was sent."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = time.monotonic()
        self.stop = asyncio.Event()
        self.writers: set[Connection] = set()
        self.infer_seq = 0  # infer requests read
        self.infer_ok = 0  # infer requests answered with a correct result
        self.streams: list[StreamRecord] = []
        self.requests: Counter[str] = Counter(infer=0, completions=0, chat_completions=0)
        # Per completion request: its prompt's words, max_tokens, stream, and the other fields.
        self.completion_log: list[dict[str, Any]] = []
        self.responses: Counter[int] = Counter()
        self.inflight = 0  # infer and completion requests read and not yet answered
        self.prompts_seen: list[tuple[str, ...]] = []  # --prefix-cache: every prompt's words, sorted

    def cached_words(self, prompt: tuple[str, ...]) -> int:
        """--prefix-cache: the longest prefix (in words) that ``prompt`` shares with a prompt
        seen before (the longest common prefix is a sorted neighbour's); then keeps it."""
        seen = self.prompts_seen
        at = bisect.bisect_left(seen, prompt)
        best = 0
        for other in seen[max(0, at - 1): at + 1]:
            n = 0
            for x, y in zip(prompt, other):
                if x != y:
                    break
                n += 1
            best = max(best, n)
        seen.insert(at, prompt)
        return best

    async def handle(self, conn: Connection) -> None:
        """Serves one connection, one request after the other."""
        self.writers.add(conn)
        try:
            while (req := await conn.requests.get()) is not None:
                keep = await self.dispatch(req, conn) and req.keep_alive
                await conn.drain()  # a large answer (/stats) is sent whole before a close
                if not keep:
                    break
        finally:
            self.writers.discard(conn)
            conn.close()

    def send(self, writer: Connection, req: Request, status: int, body: bytes = b"",
             content_type: str = "application/json", chunked: bool = False) -> None:
        """Writes a response's head and body (a chunked body follows separately)."""
        self.responses[status] += 1
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = "Status"
        length = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}"
        connection = "keep-alive" if req.keep_alive else "close"
        writer.write(f"HTTP/1.1 {status} {phrase}\r\nContent-Type: {content_type}\r\n{length}\r\n"
                     f"Connection: {connection}\r\n\r\n".encode() + body)

    def send_json(self, writer: Connection, req: Request, status: int, obj: Any) -> None:
        self.send(writer, req, status, json.dumps(obj).encode())

    async def dispatch(self, req: Request, writer: Connection) -> bool:
        """Answers req; False when the connection must end."""
        a = self.args
        get, post = req.method == "GET", req.method == "POST"
        parts = req.path.strip("/").split("/")
        # /v2/models/NAME/...: the model's name, else None
        model = parts[2] if len(parts) >= 3 and parts[:2] == ["v2", "models"] else None
        if post and parts == ["v1", "completions"]:
            return await self.completions(req, writer, chat=False)
        elif post and parts == ["v1", "chat", "completions"]:
            return await self.completions(req, writer, chat=True)
        elif post and parts == ["v1", "responses"]:
            return await self.completions(req, writer, chat=True, responses=True)
        elif post and parts == ["v1", "embeddings"]:
            return self.embeddings(req, writer)
        elif get and parts == ["v1", "models"]:
            self.requests["models"] += 1
            self.send_json(writer, req, 200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})
        elif post and model is not None and len(parts) == 4 and parts[3] == "infer":
            return await self.infer(req, writer, model)
        elif get and parts == ["v2", "health", "live"]:
            self.requests["health"] += 1
            self.send_json(writer, req, 200, {"live": True})
        elif get and (parts == ["v2", "health", "ready"]
                      or (model is not None and len(parts) == 4 and parts[3] == "ready")):
            self.requests["health"] += 1
            ready = time.monotonic() - self.started >= a.ready_after_s
            self.send_json(writer, req, 200 if ready else 503, {"ready": ready})
        elif get and model is not None and len(parts) == 3:
            self.requests["metadata"] += 1
            meta: dict[str, Any] = {"name": model, "versions": ["1"], "platform": "scripted"}
            if a.metadata_inputs:
                meta["inputs"] = [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16]}]
                meta["outputs"] = [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16]}]
            self.send_json(writer, req, 200, meta)
        elif get and parts == ["metrics"]:
            self.requests["metrics"] += 1
            self.send(writer, req, 200, self.metrics(), "text/plain; version=0.0.4; charset=utf-8")
        elif get and parts == ["stats"]:
            self.requests["stats"] += 1
            self.send_json(writer, req, 200, {
                "infer_requests": self.infer_seq, "infer_ok": self.infer_ok,
                "stream_requests": len(self.streams), "streams": [asdict(s) for s in self.streams],
                "requests": dict(self.requests), "completion_log": self.completion_log})
        else:
            self.requests["not_found"] += 1
            self.send_json(writer, req, 404, {"error": f"no route for {req.method} {req.path}"})
        return True

    async def infer(self, req: Request, writer: Connection, name: str) -> bool:
        """KServe v2 infer, with the faults planned for this request's sequence number.

        Precedence: stall, then (after --delay-ms) close, bad body (400), status, malformed,
        wrong output, empty outputs.
        """
        a = self.args
        self.requests["infer"] += 1
        self.infer_seq += 1
        seq = self.infer_seq

        def every(n: int) -> bool:
            return n > 0 and seq % n == 0

        self.inflight += 1
        try:
            if a.stall_after and seq > a.stall_after:
                await self.stop.wait()  # read, never answered; the connection stays open
                return False
            await asyncio.sleep(a.delay_ms / 1e3)
            if every(a.close_every):
                return False
            try:
                inp = json.loads(req.body)["inputs"][0]
                values = flat(inp["data"])
                out = {"name": "OUTPUT0", "datatype": "FP32", "shape": inp.get("shape", [1, len(values)]),
                       "data": [x + 1 for x in values]}
            except (ValueError, KeyError, IndexError, TypeError) as e:
                self.send_json(writer, req, 400, {"error": f"bad infer request: {e!r}"})
                return True
            answer = {"model_name": name, "model_version": "1", "outputs": [out]}
            if a.status_every and every(a.status_every[0]):
                self.send_json(writer, req, a.status_every[1], {"error": f"scripted fault on request {seq}"})
            elif every(a.malformed_every):
                self.send(writer, req, 200, b'{"model_name": "' + name.encode() + b'", "outputs": [')
            elif every(a.wrong_output_every):
                answer["outputs"] = [{"name": "WRONG", "datatype": "FP32", "shape": [1, 3], "data": [0.0] * 3}]
                self.send_json(writer, req, 200, answer)
            elif every(a.empty_outputs_every):
                answer["outputs"] = []
                self.send_json(writer, req, 200, answer)
            else:
                self.infer_ok += 1
                self.send_json(writer, req, 200, answer)
            return True
        finally:
            self.inflight -= 1

    async def completions(self, req: Request, writer: Connection, chat: bool, responses: bool = False) -> bool:
        """OpenAI completions, chat completions or responses, streamed or not."""
        a = self.args
        self.requests["responses" if responses else "chat_completions" if chat else "completions"] += 1
        try:
            body = json.loads(req.body)
            limit = (body.get("max_output_tokens") if responses else None) or body.get("max_tokens") \
                or body.get("max_completion_tokens") or a.tokens
            n = max(1, min(a.tokens, int(limit)))
            messages = _messages(body, responses) if chat else []
            texts = [m.get("content") for m in messages] if chat else [body.get("prompt", "")]
            p = words(texts)
            calls = a.tool_calls if a.tool_calls and body.get("tools") and not _tool_result(messages) else 0
            usage: dict[str, Any] = ({"input_tokens": p, "output_tokens": n, "total_tokens": p + n} if responses
                                     else {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n})
            streamed = bool(body.get("stream"))
            entry = {"prompt_words": p, "completion_tokens": n, "stream": streamed, "recv_ns": req.recv_ns,
                     "tool_calls": calls, **{k: v for k, v in body.items() if k not in ("prompt", "messages", "input")}}
            if a.prefix_cache:
                cached = self.cached_words(tuple(w for t in texts if isinstance(t, str) for w in t.split()))
                details = "input_tokens_details" if responses else "prompt_tokens_details"
                usage[details] = {"cached_tokens": cached}
                entry["cached_tokens"] = cached
            if a.log_messages and chat:
                entry["messages"] = messages
            if chat:
                entry["images"] = image_parts(body.get("messages"))
            self.completion_log.append(entry)
            include_usage = a.usage or bool((body.get("stream_options") or {}).get("include_usage"))
        except (ValueError, TypeError, AttributeError) as e:
            self.send_json(writer, req, 400, {"error": f"bad completion request: {e!r}"})
            return True
        reasoning = min(n, a.reasoning_tokens) if chat else 0
        base: dict[str, Any] = {"id": f"{'chat' if chat else ''}cmpl-{req.recv_ns}",
                                "object": ("chat.completion.chunk" if streamed else "chat.completion") if chat
                                else "text_completion", "created": int(time.time()),
                                "model": body.get("model", "scripted")}
        if responses:
            base = {"id": f"resp-{req.recv_ns}", "object": "response", "created_at": int(time.time()),
                    "model": body.get("model", "scripted")}
        tool = _first_tool(body) if calls else ""
        self.inflight += 1
        try:
            if streamed:
                plan = Answer(n, reasoning, calls, tool, chat, responses)
                return await self.stream(req, writer, base, plan, usage if include_usage else None)
            await sleep_until(req.recv_ns + round(a.ttft_ms * MS) + (n - 1) * round(a.itl_ms * MS))
            if reasoning:  # counted in usage as a stream's are (the text is the answer's)
                details = "output_tokens_details" if responses else "completion_tokens_details"
                usage = {**usage, details: {"reasoning_tokens": reasoning}}
            self.send_json(writer, req, 200, Answer(n, reasoning, calls, tool, chat, responses).whole(base, usage))
            return True
        finally:
            self.inflight -= 1

    def embeddings(self, req: Request, writer: Connection) -> bool:
        """OpenAI embeddings: one 8-float vector per input text, at once."""
        self.requests["embeddings"] += 1
        try:
            body = json.loads(req.body)
            inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
            p = words(inputs)
        except (ValueError, TypeError, KeyError) as e:
            self.send_json(writer, req, 400, {"error": f"bad embeddings request: {e!r}"})
            return True
        data = [{"object": "embedding", "index": i, "embedding": [0.125] * 8} for i in range(len(inputs))]
        self.send_json(writer, req, 200, {"object": "list", "data": data, "model": body.get("model", "scripted"),
                                          "usage": {"prompt_tokens": p, "total_tokens": p}})
        return True

    async def stream(self, req: Request, writer: Connection, base: dict[str, Any], answer: Answer,
                     usage: dict[str, Any] | None) -> bool:
        """Streams an answer's n tokens as Server-Sent Events (module doc). Every event is
        written by a timer callback of its own, all scheduled up front: no task wakes up
        per event, and the loop runs the writes due at one wake-up together."""
        a = self.args
        n, reasoning = answer.n, answer.reasoning
        k = a.tokens_per_chunk
        first = min(n, a.first_chunk_tokens or k)
        record = StreamRecord(req.recv_ns, n, k, first, reasoning, tool_calls=answer.calls)
        self.streams.append(record)
        ttft, itl = round(a.ttft_ms * MS), round(a.itl_ms * MS)
        if reasoning and usage is not None:
            details = "output_tokens_details" if answer.responses else "completion_tokens_details"
            usage = {**usage, details: {"reasoning_tokens": reasoning}}
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bool] = loop.create_future()
        transport = writer.transport

        def write(data: bytes, last: bool) -> None:
            if done.done():
                return
            if transport.is_closing():  # the client went away
                done.set_result(False)
                return
            record.token_write_ns.append(time.monotonic_ns())
            transport.write(data)
            if last:
                record.usage_sent = usage is not None
                done.set_result(True)

        # Encoded once per request: the events differ only by their token count and kind.
        events: dict[tuple[int, int, int], bytes] = {}
        tail = answer.tail(base, usage)
        self.send(writer, req, 200, content_type="text/event-stream", chunked=True)
        head = answer.head(base)
        if head:
            writer.write(head)
        plan = []
        starts = sorted({0, *range(first, n, k), *([reasoning] if 0 < reasoning < n else []),
                         *answer.call_starts()})
        for start, end in zip(starts, [*starts[1:], n]):
            count = end - start
            key = (count, answer.kind_at(start), int(answer.starts_part(start)))
            data = events.get(key) or events.setdefault(key, answer.event(base, count, start, a.reasoning_field))
            last = start + count == n
            plan.append((req.recv_ns + ttft + (start + count - 1) * itl, data + tail if last else data, last))
        # One timer at a time, each write setting the next: a burst of new requests then
        # costs one timer each, not one per event, and reading them is not held up.
        timer: list[asyncio.TimerHandle] = []

        def step(i: int) -> None:
            _, data, last = plan[i]
            write(data, last)
            if not last and not done.done():
                timer[0] = loop.call_at(plan[i + 1][0] / 1e9, step, i + 1)

        timer.append(loop.call_at(plan[0][0] / 1e9, step, 0))
        try:
            return await done
        finally:
            timer[0].cancel()

    def metrics(self) -> bytes:
        lines = ["# HELP scripted_requests_total Requests read, by endpoint.",
                 "# TYPE scripted_requests_total counter"]
        lines += [f'scripted_requests_total{{endpoint="{k}"}} {v}' for k, v in sorted(self.requests.items())]
        lines += ["# HELP scripted_responses_total Responses sent, by status.",
                  "# TYPE scripted_responses_total counter"]
        lines += [f'scripted_responses_total{{status="{k}"}} {v}' for k, v in sorted(self.responses.items())]
        lines += ["# HELP scripted_inflight Infer and completion requests read and not yet answered.",
                  "# TYPE scripted_inflight gauge", f"scripted_inflight {self.inflight}"]
        return ("\n".join(lines) + "\n").encode()


def request_short_slice(slice_ns: int = 100_000) -> None:
    """Asks Linux for a 0.1 ms scheduler slice (sched_setattr; EEVDF, Linux 6.12 and later):
    a waking task whose slice is shorter than the running one's preempts it, so a busy
    process on the same core does not hold a due write back for its whole slice (some ms).
    Needs no privilege; without support nothing changes."""
    number = {"x86_64": 314, "aarch64": 274}.get(platform.machine())  # sched_setattr(2)
    if number is not None:
        attr = struct.pack("IIQiIQQQII", 56, os.sched_getscheduler(0), 0, os.getpriority(os.PRIO_PROCESS, 0),
                           0, slice_ns, 0, 0, 0, 0)  # struct sched_attr, size 56
        ctypes.CDLL(None).syscall(ctypes.c_long(number), ctypes.c_long(0), attr, ctypes.c_long(0))


async def serve(args: argparse.Namespace) -> None:
    """Serves until SIGTERM/SIGINT or --max-runtime-s."""
    server = ScriptedServer(args)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.stop.set)
    loop.call_later(args.max_runtime_s, server.stop.set)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", args.port))
    listener.listen(1024)
    listener.setblocking(False)
    context = tls_context(args.tls_cert, args.tls_key) if args.tls_cert else None

    def accept() -> None:
        try:
            sock, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        conn = TlsConnection(sock, loop, context) if context is not None else Connection(sock, loop)
        loop.create_task(server.handle(conn))

    loop.add_reader(listener.fileno(), accept)
    print(f"PORT {listener.getsockname()[1]}", flush=True)
    await server.stop.wait()
    loop.remove_reader(listener.fileno())
    listener.close()
    for writer in list(server.writers):
        writer.close()


def positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return n


def every_status(text: str) -> tuple[int, int]:
    n, _, code = text.partition(":")
    return positive(n), int(code)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=0, help="0 (default): a free port")
    p.add_argument("--max-runtime-s", type=float, default=600.0, help="default %(default)s")
    p.add_argument("--tls-cert", metavar="PEM", help="serve HTTPS with this certificate chain (and --tls-key)")
    p.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    p.add_argument("--selector", choices=("select", "epoll"), default="select",
                   help="the event loop's selector: select (microsecond waits, file descriptors below 1024) "
                        "or epoll (waits in whole milliseconds, no descriptor limit); default select")
    g = p.add_argument_group("completions")
    g.add_argument("--ttft-ms", type=float, default=50.0,
                   help="first token, after the request was read; default %(default)s")
    g.add_argument("--itl-ms", type=float, default=10.0, help="between tokens; default %(default)s")
    g.add_argument("--tokens", type=positive, default=32,
                   help="per answer (a smaller max_tokens wins); default %(default)s")
    g.add_argument("--log-messages", action="store_true",
                   help="keep each chat request's messages (a responses request's input as messages) in "
                        "/stats' completion_log")
    g.add_argument("--tokens-per-chunk", type=positive, default=1, help="tokens per stream event; default 1")
    g.add_argument("--first-chunk-tokens", type=positive, default=None,
                   help="tokens in a stream's first event (default: --tokens-per-chunk)")
    g.add_argument("--reasoning-tokens", type=int, default=0, metavar="R",
                   help="chat: the first R tokens of a stream are reasoning; default 0")
    g.add_argument("--reasoning-field", choices=("reasoning_content", "reasoning"), default="reasoning_content",
                   help="the delta's field of reasoning tokens; default %(default)s")
    g.add_argument("--tool-calls", type=int, default=0, metavar="N",
                   help="chat and responses: answer a request carrying tools, whose last message is not a tool "
                        "result, with N tool calls; default 0")
    g.add_argument("--prefix-cache", action="store_true",
                   help="usage.prompt_tokens_details.cached_tokens: the words of the longest prefix the prompt "
                        "shares with one seen before")
    g.add_argument("--usage", action=argparse.BooleanOptionalAction, default=True,
                   help="usage chunk in every stream, not only on stream_options.include_usage; default on")
    g = p.add_argument_group("KServe v2 (faults apply to infer requests by 1-based sequence number)")
    g.add_argument("--ready-after-s", type=float, default=0.0, help="ready answers 503 until then; default 0")
    g.add_argument("--no-metadata-inputs", dest="metadata_inputs", action="store_false",
                   help="model metadata without inputs and outputs")
    g.add_argument("--delay-ms", type=float, default=0.0, help="before each infer answer; default 0")
    g.add_argument("--malformed-every", type=positive, default=0, metavar="N", help="200 with a non-JSON body")
    g.add_argument("--wrong-output-every", type=positive, default=0, metavar="N",
                   help='200 with output "WRONG" of shape [1,3]')
    g.add_argument("--empty-outputs-every", type=positive, default=0, metavar="N", help='200 with "outputs": []')
    g.add_argument("--status-every", type=every_status, default=None, metavar="N:CODE",
                   help='status CODE with {"error": ...}')
    g.add_argument("--stall-after", type=positive, default=0, metavar="N",
                   help="later requests are read, never answered")
    g.add_argument("--close-every", type=positive, default=0, metavar="N", help="connection closed, no answer")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    request_short_slice()
    # loop.time() is time.monotonic() here: timers are set at due_ns / 1e9.
    selector = selectors.EpollSelector if args.selector == "epoll" else selectors.SelectSelector
    with asyncio.Runner(loop_factory=lambda: asyncio.SelectorEventLoop(selector())) as runner:
        runner.run(serve(args))


if __name__ == "__main__":
    main()
