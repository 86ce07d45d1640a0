"""The per-request records of streamed LLM requests carry each request's inter-token
gaps (``itl_ns``: one per gap between consecutive token events) and the tokens of each
event (``tokens_per_event``), on the native and the asyncio client, in JSON lines and in
Parquet; requests without a stream have neither (null)."""

from __future__ import annotations

import json

import pytest

from tests.integration.test_net_servers import run_doc
from tests.servers.scripted_proc import start_scripted
from tests.unit.test_records import read_records

ENGINES = ("native", "asyncio")
MS = 1_000_000
# 24 tokens in events of 4, 4 ms a token: 6 events, 16 ms apart.
TOKENS, PER_EVENT, ITL_MS = 24, 4, 4


def _rows(path):
    """The records as dicts (JSON lines or Parquet alike; lists as Python lists)."""
    df = read_records(path)
    rows = df.to_dict("records")
    for r in rows:
        for key in ("itl_ns", "tokens_per_event"):
            v = r[key]
            r[key] = None if v is None or (isinstance(v, float) and v != v) else [int(x) for x in v]
    return rows


@pytest.mark.integration
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_each_streamed_record_has_its_gaps_between_token_events_on_both_clients(tmp_path, fmt):
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    rec = {e: tmp_path / f"{e}.{fmt}" for e in ENGINES}
    with start_scripted(tmp_path, "--ttft-ms", "5", "--itl-ms", ITL_MS, "--tokens", TOKENS,
                        "--tokens-per-chunk", PER_EVENT) as srv:
        docs = {e: run_doc("--sut", f"openai+{srv.url}/v1/chat/completions", "--http-engine", e, "--model", "m",
                           "--scenario", "concurrency", "--concurrency", "4", "--query-count", "24",
                           "--record-requests", str(rec[e])) for e in ENGINES}
        st = srv.stats()
    events = TOKENS // PER_EVENT
    server_gaps = [b - a for s in st["streams"] for a, b in zip(s["token_write_ns"], s["token_write_ns"][1:])]
    gaps_by_engine = {}
    for e in ENGINES:
        assert docs[e]["network"]["http_engine"] == e
        assert docs[e]["counts"]["completed"] == 24
        rows = _rows(rec[e])
        assert len(rows) == 24 and all(r["status"] == "ok" for r in rows)
        gaps = []
        for r in rows:
            # One gap per pair of consecutive token events; every event's tokens, summing to
            # the request's output tokens (usage's count spread over the events).
            assert len(r["itl_ns"]) == events - 1 and r["tokens_per_event"] == [PER_EVENT] * events, r
            assert sum(r["tokens_per_event"]) == r["output_tokens"] == TOKENS
            assert all(g >= 0 for g in r["itl_ns"])
            # The first event is the first token; the gaps lead from it to the last event,
            # which came before the request completed.
            assert r["first_token_ns"] + sum(r["itl_ns"]) <= r["completed_ns"]
            gaps += r["itl_ns"]
        gaps_by_engine[e] = sorted(gaps)  # (read_records: a Parquet run left no spool or side file)
    # Each gap is near the server's own (16 ms between its writes); loose bounds: the
    # machine is busy, so a read may come late (and the next gap short).
    scripted = PER_EVENT * ITL_MS * MS
    assert sorted(server_gaps)[len(server_gaps) // 2] == pytest.approx(scripted, rel=0.25)
    for e, gaps in gaps_by_engine.items():
        assert gaps[len(gaps) // 2] == pytest.approx(scripted, rel=0.5), e
        assert max(gaps) < scripted + 500 * MS, e


@pytest.mark.integration
def test_records_without_a_stream_have_no_gap_lists(tmp_path):
    rec = tmp_path / "requests.jsonl"
    with start_scripted(tmp_path, "--ttft-ms", "1", "--itl-ms", "0.5", "--tokens", "4") as srv:
        run_doc("--sut", f"openai+{srv.url}/v1/chat/completions", "--http-engine", "native", "--model", "m",
                "--no-stream", "--scenario", "concurrency", "--concurrency", "2", "--query-count", "6",
                "--record-requests", str(rec))
    rows = [json.loads(line) for line in rec.read_text().splitlines()]
    assert len(rows) == 6
    assert all(r["itl_ns"] is None and r["tokens_per_event"] is None for r in rows)
