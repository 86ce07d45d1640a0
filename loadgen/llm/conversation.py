"""Multi-turn conversations (``--turns N``, ``--think-time-ms DIST``), built before the run.

A conversation is a list of user turns. Each turn's request body is prepared with its
own user message (``messages`` holding that one message, its ``max_tokens`` and every
other field as for single requests); at send time the conversation's history so far,
each earlier user message and the server's actual reply to it, goes in front. The first
turn has no history, so its bytes are prepared like any single request.

Synthetic conversations draw every turn's length from ``--input-tokens`` and
``--output-tokens``; with ``--shared-prefix-tokens K --prefix-groups G``, the first turn
of conversation ``c`` starts with group ``c % G``'s prefix (later turns carry it in the
history). A dataset gives conversations as :func:`loadgen.llm.dataset.read_conversations`
reads them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional

import numpy as np

from loadgen.llm.dataset import Prompt, read_conversations
from loadgen.llm.dist import LengthDist, parse_dist
from loadgen.llm.workload import (LlmOptions, PromptBuilder, add_images, check_prompt_bytes, length_stats,
                                  max_tokens_of, request_body, sample_prefixes, workload_setup)

__all__ = ["Conversations", "build_conversations", "parse_think_time"]

#: The longest think time, ms (an hour).
MAX_THINK_MS = 3_600_000


def parse_think_time(text: Optional[str]) -> LengthDist:
    """``--think-time-ms``: whole milliseconds from 0 (default: 0)."""
    return parse_dist(text if text else "0", limit=MAX_THINK_MS, low=0, unit="ms")


@dataclasses.dataclass
class Conversations:
    """Per conversation, one prepared body per user turn (its ``messages`` holding that
    turn's user message only), each turn's own input tokens, the description for the
    result's ``llm`` section, and with ``--images`` each first turn's image bytes."""

    bodies: List[List[Dict[str, Any]]]
    turn_tokens: List[List[int]]
    think: LengthDist
    info: Dict[str, Any]
    source: str
    image_bytes: List[int] = dataclasses.field(default_factory=list)


def _synthetic(o: LlmOptions, builder: PromptBuilder, rng: np.random.Generator, count: int,
               info: Dict[str, Any]) -> List[List[Prompt]]:
    dist = parse_dist(o.input_tokens) if o.input_tokens else parse_dist(str(o.prompt_words))
    out_dist = parse_dist(o.output_tokens) if o.output_tokens else None
    n = count * o.turns
    lengths = dist.draw(rng, n)
    check_prompt_bytes(o, builder.tok, int(lengths.sum()) + count * o.shared_prefix_tokens, n)
    outs = out_dist.draw(rng, n) if out_dist else np.full(n, o.max_tokens)
    info.update(input_tokens=dist.describe(), output_tokens=out_dist.describe() if out_dist else
                {"spec": str(o.max_tokens), "kind": "fixed", "value": o.max_tokens})
    k = o.shared_prefix_tokens
    prefixes = sample_prefixes(o, builder, count, info)
    convs: List[List[Prompt]] = []
    for c in range(count):
        turns = []
        for j in range(o.turns):
            i = c * o.turns + j
            if j == 0 and k:
                text = builder.text(int(lengths[i]), prefixes[c], k)
                turns.append(Prompt(text, k + int(lengths[i]), int(outs[i])))
            else:
                turns.append(Prompt(builder.text(int(lengths[i])), int(lengths[i]), int(outs[i])))
        convs.append(turns)
    return convs


def build_conversations(o: LlmOptions, endpoint: str, model: Optional[str]) -> Conversations:
    """The conversations of a ``--turns`` run on a chat target.

    Raises:
        ValueError: not a chat target, or a bad dataset, distribution, tokenizer or
            ``--extra-body`` (the message names the option).
    """
    if endpoint not in ("chat", "responses"):
        raise ValueError(f"--turns {o.turns}: conversations need a /v1/chat/completions or /v1/responses target")
    think = parse_think_time(o.think_time_ms)
    st = workload_setup(o, endpoint)
    extra, tok, count_fn, rng, count, info = st.extra, st.tok, st.count_fn, st.rng, st.count, st.info
    if o.dataset:
        convs, layout, read = read_conversations(o.dataset, count_fn, tok is not None, o.turns,
                                                 o.dataset_min_input_tokens, o.dataset_max_input_tokens, count)
        if o.output_tokens:
            outs = iter(parse_dist(o.output_tokens).draw(rng, sum(len(c) for c in convs)))
            for conv in convs:
                for p in conv:
                    p.max_tokens = p.max_tokens or int(next(outs))
        info.update(source="dataset", dataset=o.dataset, layout=layout, records_read=read,
                    records_used=len(convs), min_input_tokens=o.dataset_min_input_tokens,
                    max_input_tokens=o.dataset_max_input_tokens or None)
        source = f"dataset {o.dataset} ({layout}, {len(convs)} of {read} conversations)"
    else:
        convs = _synthetic(o, PromptBuilder(tok, rng), rng, count, info)
        info.update(source="synthetic", shared_prefix_tokens=o.shared_prefix_tokens,
                    prefix_groups=o.prefix_groups if o.shared_prefix_tokens else 0)
        source = f"synthetic ({len(convs)} conversations of {o.turns} turns, seed {o.seed})"
    where = f"--dataset {o.dataset}" if o.dataset else "--input-tokens"
    bodies = [[request_body(o, endpoint, model, p, f"{where}: conversation {c + 1} turn {j + 1}", extra)
               for j, p in enumerate(conv)] for c, conv in enumerate(convs)]
    turns_per = [len(c) for c in convs]
    info["conversations"] = {"turns": o.turns, "think_time_ms": think.describe(), "count": len(convs),
                             "turns_per_conversation": length_stats(turns_per)}
    info["prompts"] = {"input_tokens": length_stats([p.input_tokens for c in convs for p in c]),
                       "max_tokens": length_stats([max_tokens_of(b) for c in bodies for b in c])}
    image_bytes = add_images(o, endpoint, [c[0] for c in bodies], info)  # the first turns only
    return Conversations(bodies, [[p.input_tokens for p in c] for c in convs], think, info, source, image_bytes)
