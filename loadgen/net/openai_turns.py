"""Multi-turn chat (``--turns N``): conversations whose turns go out one after another.

A conversation's first turn is a query the engine issues like any other (its sample
index picks the conversation; its bytes are prepared): in a closed loop each of the N
users holds one conversation at a time; in an open loop (constant, poisson, ramp, trace)
conversations start at the schedule's arrivals. When a turn's answer is complete, the
answer's text joins the history and the next turn is handed to the engine as a follow-up
(``Engine::follow_up``) due at the answer's completion time plus a think time drawn from
``--think-time-ms``: the engine issues it at that time and its latency, TTFT and issue
delay count from that due time like any scheduled query's. The follow-up is scheduled
before the turn is completed, so in a closed loop the user's place is never free in
between; after the last turn (or a failed one) the place frees, and the loop starts the
next conversation. Follow-ups are handed out with sample index ``FOLLOW_TAG | session
id``, which the per-request records show.

On the native client (:class:`~loadgen.net.native.NativeOpenAISUT`) the core sends the
turns and reads the answers; each answer (a stream's bytes, or the whole JSON) comes to
this class's checks on the client's checker thread (:meth:`ConversationSUT.native_turn`
names its session by its sample index), and the next turn's request goes to the core
(``add_request``) before its follow-up is scheduled.

On ``/v1/responses`` the history goes in the request's ``input`` as a message list (no
``previous_response_id``: the server keeps no state). With ``--tools``, a turn whose
answer made tool calls is followed by a turn that carries, in place of its own user
message, the calls' results: after the history with the assistant's message and its
``tool_calls``, one ``role: "tool"`` message per call (``tool_call_id``, ``content``) on
chat, or the ``function_call`` items and one ``function_call_output`` item per call
(``call_id``, ``output``) on responses; a result is the function's ``x-result`` from the
tools file, else :data:`~loadgen.llm.tools.DEFAULT_TOOL_RESULT`.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from loadgen.llm.conversation import Conversations, build_conversations
from loadgen.llm.images import text_only
from loadgen.net.http1 import Request
from loadgen.net.openai_stream import OpenAISUT
from loadgen.net.openai_answers import TokenStream, WholeResponse, whole_calls, whole_text
from loadgen.units import NS_PER

__all__ = ["ConversationSUT", "FOLLOW_TAG"]

#: Sample indices at or above this are follow-up turns (the session id in the low bits).
FOLLOW_TAG = 1 << 62
_THINK_DRAWS = 4096  # think times drawn at a time


class _Session:
    """One conversation under way: which one, the next turn, the history so far."""

    __slots__ = ("sid", "conv", "turn", "messages", "history_tokens", "calls")

    def __init__(self, sid: int, conv: int) -> None:
        self.sid = sid
        self.conv = conv
        self.turn = 0
        self.messages: List[Dict[str, Any]] = []
        self.history_tokens = 0
        self.calls: List[Dict[str, Any]] = []  # the last answer's tool calls (their results go next)


def _user_messages(body: Dict[str, Any]) -> List[Any]:
    """A prepared turn's own messages: chat's ``messages``, or ``/v1/responses``'s
    ``input`` (a prompt becomes one user message)."""
    if "messages" in body:
        return list(body["messages"])
    given = body["input"]
    return list(given) if isinstance(given, list) else [{"role": "user", "content": given}]


def _assistant_messages(reply: str, calls: List[Dict[str, Any]], responses: bool) -> List[Dict[str, Any]]:
    """The history's record of an answer: its text and its tool calls, in the target's form."""
    if responses:
        out: List[Dict[str, Any]] = [{"role": "assistant", "content": reply}] if reply or not calls else []
        return out + [{"type": "function_call", "call_id": c["id"], "name": c["name"], "arguments": c["arguments"]}
                      for c in calls]
    msg: Dict[str, Any] = {"role": "assistant", "content": reply if reply or not calls else None}
    if calls:
        msg["tool_calls"] = [{"id": c["id"], "type": "function",
                              "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]
    return [msg]


class ConversationSUT(OpenAISUT):
    """The OpenAI chat target with ``--turns``: see the module doc."""

    follow_ups = True  # the engine takes follow-up queries from it (EngineSettings.follow_ups)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conversations: Optional[Conversations] = None
        self._by_query: Dict[int, _Session] = {}
        self._waiting: Dict[int, _Session] = {}
        self._next_sid = 0
        self._think_ns = np.zeros(0, dtype=np.int64)
        self._think_at = 0
        self._rng = np.random.default_rng()
        self.started = 0
        self.finished = 0
        self.cut_by_failure = 0
        self.turns_completed: List[int] = []
        self.history_messages_max = 0
        # The native client: takes each follow-up's request (tag, bytes, input tokens)
        # before it is scheduled; and the engine's counts, for the conversations' ends
        # that only the core sees (a turn failed or cancelled there).
        self.add_request: Optional[Callable[..., Any]] = None
        self.engine_counts: Optional[Callable[[], Dict[str, int]]] = None

    def _bodies(self) -> Tuple[List[dict], str]:
        if self.net.payload:
            raise ValueError("--turns builds its own conversations: it does not take --payload")
        llm = self.llm_options()
        convs = build_conversations(llm, self.target.endpoint, self.model)
        for turns, name in zip(convs.bodies, self.drawn_models(len(convs.bodies))):
            for body in turns:
                body["model"] = name
        for turns in convs.bodies:
            for body in turns:
                self.add_tools(body)
        self.conversations = convs
        self.image_bytes = convs.image_bytes
        self._rng = np.random.default_rng(llm.seed + 7)
        self.turns_completed = [0] * max(len(c) for c in convs.bodies)
        self.input_lens = [int(t[0]) for t in convs.turn_tokens]  # the first turns' (the native client counts them)
        return [c[0] for c in convs.bodies], convs.source

    def _think(self) -> int:
        if self._think_at >= len(self._think_ns):
            assert self.conversations is not None
            self._think_ns = self.conversations.think.draw(self._rng, _THINK_DRAWS) * NS_PER["ms"]
            self._think_at = 0
        v = int(self._think_ns[self._think_at])
        self._think_at += 1
        return v

    def issue_query(self, query_id: int, sample_index: int, scheduled_ns: int) -> None:
        convs = self.conversations
        pool = self.pool
        if pool is None or convs is None:
            raise RuntimeError("issue_query before open_on_loop: the connection pool is not open")
        if sample_index >= FOLLOW_TAG:
            session = self._waiting.pop(sample_index - FOLLOW_TAG)
            data = self._turn_request(session)
        else:
            conv = sample_index % len(convs.bodies)
            session = _Session(self._next_sid, conv)
            self._next_sid += 1
            self.started += 1
            data = self.requests[conv]
            self.count_images(conv)
        self._by_query[query_id] = session
        n_input = session.history_tokens + self._turn_tokens(session)
        self.input_tokens_sent += n_input
        handler: Any
        if self.stream_responses:
            handler = TokenStream(self, query_id, scheduled_ns)
            handler.texts, handler.calls = [], []
        else:
            handler = WholeResponse(self, query_id, scheduled_ns)
        handler.n_input = n_input
        self.count_model(handler, session.conv)
        pool.submit(Request(data, handler, query_id, self.stream_responses), scheduled_ns + self.timeout_ns
                    if self.timeout_ns else 0)

    def _turn_input(self, session: _Session) -> List[Any]:
        """What ``session``'s next turn sends after the history: the results of the last
        answer's tool calls, or else the turn's own user message."""
        assert self.conversations is not None
        if not session.calls:
            return _user_messages(self.conversations.bodies[session.conv][session.turn])
        results = [(c["id"], self.tools.result(c["name"]) if self.tools is not None else "") for c in session.calls]
        if self.responses:
            return [{"type": "function_call_output", "call_id": i, "output": r} for i, r in results]
        return [{"role": "tool", "tool_call_id": i, "content": r} for i, r in results]

    def _turn_tokens(self, session: _Session) -> int:
        """The input tokens of ``session``'s next turn, less the history (a tool result's
        words, as words stand for tokens)."""
        assert self.conversations is not None
        if not session.calls:
            return self.conversations.turn_tokens[session.conv][session.turn]
        return sum(len(self.tools.result(c["name"]).split()) for c in session.calls) if self.tools else 0

    def _turn_request(self, session: _Session) -> bytes:
        """The request of ``session``'s next turn: its messages after the history so far."""
        assert self.conversations is not None
        body = dict(self.conversations.bodies[session.conv][session.turn])
        key = "input" if self.responses else "messages"
        body[key] = session.messages + self._turn_input(session)
        self.history_messages_max = max(self.history_messages_max, len(body[key]))
        return self.serialize("POST", self.target.path, json.dumps(body, separators=(",", ":")).encode())

    def native_turn(self, qid: int, sample_index: int) -> None:
        """The native client's answer to query ``qid`` (sample index ``sample_index``)
        is about to be checked: its session (a follow-up's, or a new conversation's) is
        the query's, as :meth:`issue_query` makes it for the asyncio client."""
        convs = self.conversations
        if convs is None:
            raise RuntimeError("native_turn before prepare: the conversations are not built")
        if sample_index >= FOLLOW_TAG:
            session = self._waiting.pop(sample_index - FOLLOW_TAG, None)
            if session is None:
                return
        else:
            session = _Session(self._next_sid, sample_index % len(convs.bodies))
            self._next_sid += 1
        self._by_query[qid] = session

    def model_of(self, qid: int, sample_index: int) -> int:
        """The model of turn ``qid``: its conversation's (see :meth:`native_turn`)."""
        session = self._by_query.get(qid)
        return self.request_models[session.conv] if session is not None else super().model_of(qid, sample_index)

    def native_stream(self, qid: int, body: bytes, n_tokens: int, t: int) -> None:
        """The native client's good stream for turn ``qid``: ``body`` its bytes (the
        reply's text is read from them), ``n_tokens`` its output tokens as the core counted
        them, complete at ``t``. The core recorded its figures; this advances the
        conversation (the caller then completes the turn)."""
        stream = TokenStream(self, qid, 0)
        stream.texts, stream.calls = [], []
        stream.read_whole(body, t)
        self._advance(qid, "".join(stream.texts), n_tokens, t, stream.calls)

    def _advance(self, qid: int, reply: str, n_tokens: int, t: int, calls: List[Dict[str, Any]]) -> None:
        """Turn ``qid`` answered with ``reply`` (and tool ``calls``) at ``t``: the next turn
        as a follow-up (before the caller completes this one), or the conversation's end."""
        session = self._by_query.pop(qid, None)
        convs = self.conversations
        if session is None or convs is None:
            return
        turns = convs.bodies[session.conv]
        self.turns_completed[session.turn] += 1
        # The first turn's images are not sent again: the history holds its text.
        session.messages = (session.messages + [text_only(m) for m in self._turn_input(session)]
                            + _assistant_messages(reply, calls, self.responses))
        session.history_tokens += self._turn_tokens(session) + max(n_tokens, 0)
        session.calls = calls
        session.turn += 1
        if session.turn >= len(turns):
            self.finished += 1
            return
        self._waiting[session.sid] = session
        tag = FOLLOW_TAG | session.sid
        if self.add_request is not None:  # the native client: the request goes first, with its model's group
            self.add_request(tag, self._turn_request(session), session.history_tokens + self._turn_tokens(session),
                             self.request_models[session.conv] if self.request_models else -1)
        if not self.sink.follow_up(tag, t + self._think()):
            del self._waiting[session.sid]  # issuing has ended: the engine counts it dropped

    def record_stream(self, s: TokenStream, t: int) -> None:
        n = s.usage_tokens if s.usage_tokens >= 0 else s.chunks
        self._advance(s.query_id, "".join(s.texts or ()), n, t, s.calls or [])
        super().record_stream(s, t)

    def record_whole(self, w: WholeResponse, t: int, n: int, doc: Dict[str, Any]) -> None:
        self._advance(w.query_id, whole_text(doc, self.responses), n, t, whole_calls(doc, self.responses))
        super().record_whole(w, t, n, doc)

    def fail_query(self, qid: int, kind: str, message: str) -> None:
        if self._by_query.pop(qid, None) is not None:
            self.cut_by_failure += 1
        super().fail_query(qid, kind, message)

    def report(self) -> Dict[str, Any]:
        out = super().report()
        out["llm"] = self.llm_section()
        return out

    def llm_section(self) -> Dict[str, Any]:
        """The ``llm`` section, with ``conversations``: started, finished, cut short (by a
        failed turn, or by the run's end: follow-ups dropped and turns left unanswered),
        completed turns by turn index, the engine's follow-up counts, and the longest
        history sent (messages)."""
        out = super().llm_section()
        if self.conversations is not None:
            out.update({k: v for k, v in self.conversations.info.items()})
            self.count_images_sent(out)
        engine = getattr(self.sink, "follow_ups", None)
        follow = engine() if callable(engine) else {}
        conv = dict(out.get("conversations") or {})
        dropped = int(follow.get("dropped", 0))
        started, failed, unanswered = self.started, self.cut_by_failure, len(self._by_query)
        if self.engine_counts is not None:
            # The native client: turns are issued, and may fail or be cancelled, in the
            # core, so the engine's counts say how conversations started and ended.
            c = self.engine_counts()
            started = c["issued"] + c["warmup_issued"] - int(follow.get("issued", 0))
            failed = c["failed"] + c["timed_out"] + c["warmup_failed"]
            unanswered = c["cancelled"]
        conv.update(started=started, finished=self.finished,
                    cut_short={"failed_turn": failed, "run_ended": dropped + unanswered},
                    turns_completed=self.turns_completed, follow_ups=follow,
                    history_messages_max=self.history_messages_max)
        out["conversations"] = conv
        return out
