"""Multi-turn conversations (``--turns``, ``--think-time-ms``): each turn goes out after
the previous reply plus the think time, carrying the history so far; the engine issues it
as a follow-up due at that time, and measures it from then. The scripted server logs the
messages of every chat request it answered (``--log-messages``): that log is what the
histories, and loadgen's counts, are checked against. Each runs on both HTTP clients: the
native one (the core sends the turns; the checker thread reads each reply and hands the
next turn's request back) and the asyncio one. The CLI runs as a subprocess with the
test's tmp_path as its working directory; every server is ended by its PID."""

from __future__ import annotations

import itertools
import json
import socket

import numpy as np
import pytest

from tests.servers.scripted_proc import start_scripted
from tests.helpers import _send, _Server, run_cli

FOLLOW_TAG = 1 << 62
TOKENS = 6
SERVER = ("--ttft-ms", "3", "--itl-ms", "1", "--tokens", str(TOKENS), "--log-messages")
LOAD = ("--scenario", "concurrency", "--interval-s", "0", "--max-tokens", str(TOKENS), "--max-issue-delay-ms", "1000")
ENGINES = ("native", "asyncio")


def _run(tmp_path, *args, expect=0, engine=None):
    chosen = ("--http-engine", engine) if engine else ()
    proc = run_cli("run", "--json", *LOAD, *chosen, *args, timeout=90, cwd=str(tmp_path))
    assert proc.returncode == expect, (proc.returncode, proc.stderr[-3000:])
    doc = json.loads(proc.stdout) if expect in (0, 1) else proc
    if engine and expect in (0, 1):
        assert doc["network"]["http_engine"] == engine
    return doc


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _check_histories(log, turns_by_conv=None):
    """Every chat request alternates user and assistant messages, ends with a user turn,
    and each assistant message is a reply of the server (one ' tok' per token); a request of turn k > 1 carries the
    messages of an earlier request of the same conversation plus that request's reply.
    Returns the requests' message counts."""
    seen = set()
    sizes = []
    for e in log:
        msgs = e["messages"]
        sizes.append(len(msgs))
        assert len(msgs) % 2 == 1, msgs
        assert [m["role"] for m in msgs] == ["user", "assistant"] * (len(msgs) // 2) + ["user"], msgs
        assert all(m["content"] == " tok" * len(m["content"].split()) != "" for m in msgs[1::2]), msgs
        if len(msgs) > 1:
            assert json.dumps(msgs[:-2]) in seen, "a follow-up's history is not an earlier request's messages"
        seen.add(json.dumps(msgs))
        if turns_by_conv is not None:
            users = [m["content"] for m in msgs[0::2]]
            assert any(conv[:len(users)] == users for conv in turns_by_conv), users
    return sizes


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("stream", [True, False])
def test_histories_grow_turn_by_turn_and_counts_equal_the_servers(tmp_path, stream, engine):
    think_ms = 25
    rec = tmp_path / "requests.jsonl"
    with start_scripted(tmp_path, *SERVER) as srv:
        doc = _run(tmp_path, "--sut", f"openai+{srv.url}/v1/chat/completions", "--concurrency", "3",
                   "--duration-s", "1.5", "--turns", "3", "--think-time-ms", str(think_ms),
                   "--input-tokens", "5:12", "--record-requests", str(rec), *(() if stream else ("--no-stream",)),
                   engine=engine)
        st = srv.stats()
    log = st["completion_log"]
    c, conv = doc["counts"], doc["llm"]["conversations"]
    assert c["failed"] == c["timed_out"] == 0
    # The server answered exactly what loadgen counted (cancelled at the end: asked, not answered).
    assert st["requests"]["chat_completions"] == len(log) == c["completed"] + c["cancelled"]
    sizes = _check_histories(log)
    # Turn k carries 2k-1 messages; the turns completed by index are the server's counts.
    by_turn = [sizes.count(2 * k + 1) for k in range(3)]
    done = conv["turns_completed"]
    assert sum(done) == c["completed"] and all(d <= b for d, b in zip(done, by_turn))
    assert sum(by_turn) - sum(done) == c["cancelled"]  # asked, and cut off by the run's end
    assert conv["turns_completed"][0] >= conv["turns_completed"][1] >= conv["turns_completed"][2] >= 1
    assert max(sizes) == conv["history_messages_max"] == 5
    assert conv["started"] == by_turn[0]
    cut = conv["cut_short"]
    assert conv["started"] == conv["finished"] + cut["failed_turn"] + cut["run_ended"]
    assert conv["finished"] == conv["turns_completed"][2] and cut["failed_turn"] == 0
    assert conv["follow_ups"]["issued"] == by_turn[1] + by_turn[2]
    # At most 3 users: never more than 3 requests in the server at once.
    assert doc["valid"], doc["invalid_reasons"]
    # Each follow-up is due exactly think_ms after the completion of the turn before it,
    # and measured from then.
    records = _records(rec)
    follow = [r for r in records if r["sample_index"] >= FOLLOW_TAG]
    firsts = [r for r in records if r["sample_index"] < FOLLOW_TAG]
    assert len(follow) == conv["follow_ups"]["issued"] and len(firsts) == conv["started"]
    ends = {r["completed_ns"] + think_ms * 1_000_000 for r in records if r["status"] == "ok"}
    assert all(r["scheduled_ns"] in ends for r in follow)
    assert all(r["latency_ns"] == r["completed_ns"] - r["scheduled_ns"] for r in follow if r["status"] == "ok")
    # Each turn's input tokens: the history's (user turns and replies) and its own; the
    # server counts the same words (no tokenizer: words stand for tokens).
    if c["cancelled"] == 0:
        assert sorted(r["input_tokens"] for r in records) == sorted(e["prompt_words"] for e in log)
    assert doc["input_length_tokens"]["max"] == max(r["input_tokens"] for r in records if r["status"] == "ok")
    delays = np.array([r["issued_ns"] - r["scheduled_ns"] for r in follow])
    # Issued when due, not a think time late (a busy host delays some wake-ups by a few ms).
    assert np.median(delays) < think_ms * 1_000_000 / 2
    # While a user thinks, no new conversation takes its place: at most 3 sessions at once.
    sessions = {r["sample_index"] for r in follow}
    assert len(sessions) <= conv["started"]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("scenario", [("--scenario", "poisson", "--target-qps", "40"),
                                      ("--scenario", "constant", "--target-qps", "40", "--max-in-flight", "8")])
def test_open_loop_conversations_start_at_the_arrivals(tmp_path, scenario, engine):
    think_ms = 15
    rec = tmp_path / "requests.jsonl"
    with start_scripted(tmp_path, *SERVER) as srv:
        doc = _run(tmp_path, "--sut", f"openai+{srv.url}/v1/chat/completions", *scenario, "--duration-s", "1.5",
                   "--turns", "3", "--think-time-ms", str(think_ms), "--record-requests", str(rec), engine=engine)
        st = srv.stats()
    log = st["completion_log"]
    c, conv = doc["counts"], doc["llm"]["conversations"]
    assert c["failed"] == c["timed_out"] == 0 and st["requests"]["chat_completions"] == len(log) == c["completed"]
    sizes = _check_histories(log)
    records = _records(rec)
    firsts = [r for r in records if r["sample_index"] < FOLLOW_TAG]
    follow = [r for r in records if r["sample_index"] >= FOLLOW_TAG]
    # The first turns are the schedule's arrivals (about 40/s for 1.5 s); each follow-up is
    # due exactly think_ms after the turn before it ended, whatever the arrivals did.
    assert len(firsts) == conv["started"] == sizes.count(1) and 40 <= len(firsts) <= 80
    ends = {r["completed_ns"] + think_ms * 1_000_000 for r in records}
    assert follow and all(r["scheduled_ns"] in ends for r in follow)
    assert conv["follow_ups"]["issued"] == len(follow) == sizes.count(3) + sizes.count(5)
    cut = conv["cut_short"]
    assert conv["started"] == conv["finished"] + cut["failed_turn"] + cut["run_ended"]


@pytest.mark.parametrize("stream", [True, False])
def test_both_clients_hold_the_same_conversations(tmp_path, stream):
    """One user, a query count: the same conversations, turn by turn, on both clients;
    the result's keys and counts agree, and the server answered what they counted."""
    docs, logs = {}, {}
    for engine in ENGINES:
        with start_scripted(tmp_path, *SERVER) as srv:
            docs[engine] = _run(tmp_path, "--sut", f"openai+{srv.url}/v1/chat/completions", "--concurrency", "1",
                                "--query-count", "30", "--turns", "3", "--think-time-ms", "5", "--sample-order",
                                "sequential", *(() if stream else ("--no-stream",)), engine=engine)
            logs[engine] = srv.stats()["completion_log"]
    native, asyncio_ = docs["native"], docs["asyncio"]
    assert set(native) - set(asyncio_) <= {"receive_wait_ns"} and set(asyncio_) <= set(native)
    assert set(native["network"]) - set(asyncio_["network"]) == {"io_threads", "native"}
    assert native["network"]["tokens"] == asyncio_["network"]["tokens"]
    assert native["llm"] == asyncio_["llm"]
    conv = native["llm"]["conversations"]
    assert conv["started"] == conv["finished"] == 10 and conv["turns_completed"] == [10, 10, 10]
    assert conv["follow_ups"] == {"pending": 0, "issued": 20, "dropped": 0}
    assert conv["cut_short"] == {"failed_turn": 0, "run_ended": 0}
    for doc in docs.values():
        assert doc["counts"]["completed"] == 30 and doc["counts"]["tokens"] == 30 * TOKENS
    # The same requests, history and all, reached the server from both clients.
    assert [e["messages"] for e in logs["native"]] == [e["messages"] for e in logs["asyncio"]]
    _check_histories(logs["native"])


def _every_third_fails(stream: bool):
    """A chat server whose every third POST answers HTTP 500 (the rest one token)."""
    posts = itertools.count(1)
    answer = (b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\ndata: [DONE]\n\n' if stream
              else b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": "a"}}]}')

    def route(method: str, path: str, head: bytes, sock: socket.socket) -> bool:
        if method != "POST":
            return _send(sock, 404, b"")
        if next(posts) % 3 == 0:
            return _send(sock, 500, b'{"error": "busy"}')
        return _send(sock, 200, answer, content_type="text/event-stream" if stream else "application/json")
    return route


@pytest.mark.parametrize("stream", [True, False])
def test_a_failed_turn_cuts_its_conversation_short_on_both_clients(tmp_path, stream):
    """One user, every third request failed: each conversation's third turn fails, and
    both clients count the conversations, turns and errors alike."""
    docs = {}
    for engine in ENGINES:
        srv = _Server(_every_third_fails(stream))
        try:
            docs[engine] = _run(tmp_path, "--sut", f"openai+http://127.0.0.1:{srv.port}/v1/chat/completions",
                                "--model", "m", "--concurrency", "1", "--query-count", "12", "--turns", "3",
                                "--max-error-rate", "1", *(() if stream else ("--no-stream",)),
                                engine=engine)
        finally:
            srv.stop()
    native, asyncio_ = docs["native"], docs["asyncio"]
    assert native["errors"] == asyncio_["errors"] and native["errors"]["counts"] == {"http_500": 4}
    assert native["llm"]["conversations"] == asyncio_["llm"]["conversations"]
    conv = native["llm"]["conversations"]
    assert conv["started"] == 4 and conv["finished"] == 0 and conv["turns_completed"] == [4, 4, 0]
    assert conv["cut_short"] == {"failed_turn": 4, "run_ended": 0}
    assert conv["follow_ups"]["issued"] == 8
    for doc in docs.values():
        assert doc["counts"]["completed"] == 8 and doc["counts"]["failed"] == 4


@pytest.mark.parametrize("engine", ENGINES)
def test_think_time_distribution_and_zero_think_time(tmp_path, engine):
    rec = tmp_path / "r.jsonl"
    with start_scripted(tmp_path, *SERVER) as srv:
        doc = _run(tmp_path, "--sut", f"openai+{srv.url}/v1/chat/completions", "--concurrency", "2",
                   "--duration-s", "1", "--turns", "4", "--think-time-ms", "0", "--record-requests", str(rec),
                   engine=engine)
        log = srv.stats()["completion_log"]
    _check_histories(log)
    records = _records(rec)
    ends = {r["completed_ns"] for r in records}
    follow = [r for r in records if r["sample_index"] >= FOLLOW_TAG]
    assert follow and all(r["scheduled_ns"] in ends for r in follow)
    assert doc["llm"]["conversations"]["think_time_ms"] == {"spec": "0", "kind": "fixed", "value": 0}


def test_sharegpt_conversations_send_their_human_turns_in_order(tmp_path):
    convs = [{"conversations": [{"from": "human", "value": "a1 a1"}, {"from": "gpt", "value": "x"},
                                {"from": "human", "value": "a2"}, {"from": "gpt", "value": "y"},
                                {"from": "human", "value": "a3 a3 a3"}, {"from": "gpt", "value": "z"}]},
             {"conversations": [{"from": "human", "value": "b1"}, {"from": "gpt", "value": "x"},
                                {"from": "human", "value": "b2"}, {"from": "gpt", "value": "y"}]},
             {"conversations": [{"from": "gpt", "value": "no human turn"}]}]
    data = tmp_path / "sharegpt.json"
    data.write_text(json.dumps(convs))
    with start_scripted(tmp_path, *SERVER) as srv:
        doc = _run(tmp_path, "--sut", f"openai+{srv.url}/v1/chat/completions", "--concurrency", "2",
                   "--duration-s", "1", "--turns", "5", "--dataset", str(data))
        log = srv.stats()["completion_log"]
    _check_histories(log, [["a1 a1", "a2", "a3 a3 a3"], ["b1", "b2"]])
    sizes = {len(e["messages"]) for e in log}
    assert sizes == {1, 3, 5}
    conv = doc["llm"]["conversations"]
    assert conv["count"] == 2 and conv["turns_per_conversation"]["max"] == 3
    assert doc["llm"]["records_read"] == 2 and doc["llm"]["layout"] == "sharegpt"


@pytest.mark.parametrize("engine", ENGINES)
def test_json_lines_turns(tmp_path, engine):
    data = tmp_path / "turns.jsonl"
    data.write_text(json.dumps({"turns": ["q1", "q2 q2"], "max_tokens": 3}) + "\n" + json.dumps({"prompt": "solo"}))
    with start_scripted(tmp_path, *SERVER) as srv:
        doc = _run(tmp_path, "--sut", f"openai+{srv.url}/v1/chat/completions", "--concurrency", "1",
                   "--query-count", "12", "--turns", "2", "--dataset", str(data), "--sample-order", "sequential",
                   engine=engine)
        log = srv.stats()["completion_log"]
    _check_histories(log, [["q1", "q2 q2"], ["solo"]])
    assert doc["counts"]["completed"] == len(log) == 12
    assert {e["max_tokens"] for e in log if e["messages"][0]["content"] == "q1"} == {3}


@pytest.mark.parametrize("args, says", [
    (("--scenario", "offline"), "conversations start in a closed loop"),
    (("--think-time-ms", "soon"), "--think-time-ms"),
    (("--think-time-ms", "-5"), "--think-time-ms"),
    (("--turns", "0"), "--turns"),
    (("--dataset", "MSGS"), "'turns'"),
    (("--payload", "MSGS"), "--payload"),
])
def test_bad_multi_turn_input_exits_2_naming_it(tmp_path, args, says):
    msgs = tmp_path / "m.jsonl"
    msgs.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    args = tuple(str(msgs) if a == "MSGS" else a for a in args)
    with start_scripted(tmp_path, *SERVER) as srv:
        users = () if "offline" in args else ("--concurrency", "2")
        proc = _run(tmp_path, "--sut", f"openai+{srv.url}/v1/chat/completions", *users,
                    "--query-count", "4", "--turns", "2", *args, expect=2)
    assert says in proc.stderr, proc.stderr


def test_turns_need_a_chat_target(tmp_path):
    with start_scripted(tmp_path, *SERVER) as srv:
        proc = _run(tmp_path, "--sut", f"openai+{srv.url}/v1/completions", "--concurrency", "2",
                    "--query-count", "4", "--turns", "2", expect=2)
    assert "/v1/chat/completions" in proc.stderr, proc.stderr
