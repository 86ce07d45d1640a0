"""The prompts and request bodies of an OpenAI-compatible run, all built before it.

Each sample index gets one body. Synthetic prompts draw their input and output lengths
from ``--input-tokens`` and ``--output-tokens`` with the run's sample seed; with
``--tokenizer`` a prompt is built to its exact token count (random ordinary tokens are
decoded to text, the text re-encoded, and tokens dropped or added until the count is
exact), else words stand for tokens (``input_tokens_exact`` is false). With
``--shared-prefix-tokens K --prefix-groups G``, sample ``i`` starts with the K-token
prefix of group ``i % G``, and its drawn input length comes after that prefix.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

from loadgen import defaults
from loadgen.files import size_text
from loadgen.llm.dataset import Content, Prompt, read_dataset
from loadgen.llm.dist import parse_dist
from loadgen.llm.images import attach_images, load_images
from loadgen.llm.tokenizer import Tokenizer, load_tokenizer

if TYPE_CHECKING:  # numpy is imported where it is used
    import numpy as np

__all__ = ["MAX_PROMPT_BYTES", "LlmOptions", "Workload", "build_workload", "check_prompt_bytes", "length_stats"]

_WORDS = ("the", "model", "answer", "token", "server", "load", "latency", "stream", "time", "first",
          "query", "batch", "fast", "slow", "inference", "request")
_FIX_ROUNDS = 64  # re-encode rounds before a prompt of an exact length is given up on
#: The most distinct prompts prepared; sample indices past them wrap around.
MAX_PROMPTS = 16384
#: The most synthetic prompt text built before a run. Every prompt is held as text, as
#: its encoded request body and by the native client: a run over this would take
#: gigabytes and minutes to start, so it is refused before any prompt is built.
MAX_PROMPT_BYTES = 512 << 20
#: What a synthetic prompt takes per token: the mean word and its space without a
#: tokenizer; with one, a generous mean of ordinary tokens' text.
_BYTES_PER_WORD = sum(len(w) + 1 for w in _WORDS) / len(_WORDS)
_BYTES_PER_TOKEN = 8.0


@dataclasses.dataclass
class LlmOptions:
    """The workload options of an OpenAI-compatible target (README, "LLM workloads").

    Each field is the ``loadgen run`` option of the same name (``stream`` is not
    ``--no-stream``), with its default from :mod:`loadgen.defaults`; ``seed`` is the
    run's sample seed (``--sample-seed``: by default ``--seed`` + 1, so 1 when neither is
    given), which draws the synthetic prompts.
    """

    max_tokens: int = defaults.MAX_TOKENS
    prompt_words: int = defaults.PROMPT_WORDS
    sample_count: int = defaults.SAMPLE_COUNT
    seed: int = defaults.sample_seed_of(defaults.SEED)
    dataset: Optional[str] = None
    dataset_min_input_tokens: int = defaults.DATASET_MIN_INPUT_TOKENS
    dataset_max_input_tokens: int = defaults.DATASET_MAX_INPUT_TOKENS
    input_tokens: Optional[str] = None
    output_tokens: Optional[str] = None
    shared_prefix_tokens: int = defaults.SHARED_PREFIX_TOKENS
    prefix_groups: int = defaults.PREFIX_GROUPS
    prefix_hit_ratio: float = defaults.PREFIX_HIT_RATIO
    tokenizer: Optional[str] = None
    ignore_eos: bool = False
    extra_body: Optional[str] = None
    stream: bool = True
    turns: int = defaults.TURNS
    think_time_ms: Optional[str] = None
    tools: Optional[str] = None
    tool_choice: Optional[str] = None
    images: Optional[str] = None
    images_per_request: int = defaults.IMAGES_PER_REQUEST


@dataclasses.dataclass
class Workload:
    """The bodies (one per sample index), their input lengths, the description that
    goes in the result's ``llm`` section, and with ``--images`` each body's image bytes."""

    bodies: List[Dict[str, Any]]
    input_tokens: np.ndarray
    info: Dict[str, Any]
    source: str
    image_bytes: List[int] = dataclasses.field(default_factory=list)


def length_stats(values: Any) -> Dict[str, Any]:
    """count, min, mean, p50, p90, max and sum of token counts."""
    import numpy as np

    a = np.asarray(values, dtype=np.int64)
    if not a.size:
        return {"count": 0}
    return {"count": int(a.size), "min": int(a.min()), "mean": float(a.mean()), "p50": float(np.percentile(a, 50)),
            "p90": float(np.percentile(a, 90)), "max": int(a.max()), "sum": int(a.sum())}


class PromptBuilder:
    """Prompts of given lengths: exact with a tokenizer, else words."""

    def __init__(self, tok: Optional[Tokenizer], rng: np.random.Generator) -> None:
        self.tok, self.rng = tok, rng
        self.pool = tok.word_ids() if tok is not None else None

    def text(self, n: int, head: str = "", head_tokens: int = 0) -> str:
        """``head`` (``head_tokens`` long) followed by ``n`` more tokens (words)."""
        if self.tok is None or self.pool is None:
            body = " ".join(_WORDS[i] for i in self.rng.integers(0, len(_WORDS), n))
            return f"{head} {body}" if head else body
        ids = list(self.rng.choice(self.pool, n))
        want = head_tokens + n
        for _ in range(_FIX_ROUNDS):
            body = self.tok.decode(ids)
            text = f"{head} {body}" if head else body
            d = self.tok.count(text) - want
            if d == 0:
                return text
            if d > 0:
                ids = ids[: max(1, len(ids) - d)]
            else:
                ids += list(self.rng.choice(self.pool, -d))
        raise ValueError(f"--tokenizer {self.tok.name}: no prompt of exactly {want} tokens after "
                         f"{_FIX_ROUNDS} rounds of re-encoding")


def max_tokens_of(body: Dict[str, Any]) -> int:
    """A body's output token limit: ``max_tokens``, or ``max_output_tokens`` (``/v1/responses``);
    0 for none."""
    return int(body.get("max_tokens") or body.get("max_output_tokens") or 0)


def check_prompt_bytes(o: LlmOptions, tok: Optional[Tokenizer], tokens: int, prompts: int) -> None:
    """Refuses synthetic prompts of ``tokens`` tokens in all (``prompts`` of them) whose
    text would be over :data:`MAX_PROMPT_BYTES`; ValueError naming the flags to lower."""
    need = int(tokens * (_BYTES_PER_TOKEN if tok is not None else _BYTES_PER_WORD))
    if need <= MAX_PROMPT_BYTES:
        return
    lengths = f"--input-tokens {o.input_tokens}" if o.input_tokens else f"--prompt-words {o.prompt_words}"
    raise ValueError(f"{lengths} with --sample-count {o.sample_count}: {prompts:,} distinct prompts of "
                     f"{tokens:,} tokens in all would take about {size_text(need)} to build, over the "
                     f"{size_text(MAX_PROMPT_BYTES)} loadgen builds before a run; lower --sample-count "
                     "(sample indices wrap around the prompts) or the prompt lengths")


# Added to the sample seed for the prefix hits' own stream (--prefix-hit-ratio), so that
# the prompts drawn from the sample seed stay those of a run without it.
_PREFIX_HIT_STREAM = 0x707265666978  # "prefix"


def sample_prefixes(o: LlmOptions, build: PromptBuilder, count: int, info: Dict[str, Any]) -> List[str]:
    """The prefix each of ``count`` samples (conversations) starts with ("" for none):
    group ``i % G``'s, or, for the samples that ``--prefix-hit-ratio R`` makes misses
    (drawn with the sample seed), a fresh prefix of the same length shared with none.
    Puts ``prefix_hit_ratio`` and ``prefix_hits`` (the samples starting with the pool's
    prefixes) in ``info``."""
    import numpy as np

    k = o.shared_prefix_tokens
    if not k:
        if o.prefix_hit_ratio < 1:
            raise ValueError(f"--prefix-hit-ratio {o.prefix_hit_ratio:g} needs --shared-prefix-tokens K > 0")
        return [""] * count
    pool = [build.text(k) for _ in range(o.prefix_groups)]
    hits = np.random.default_rng([o.seed, _PREFIX_HIT_STREAM]).random(count) < o.prefix_hit_ratio
    info.update(prefix_hit_ratio=o.prefix_hit_ratio, prefix_hits=int(hits.sum()))
    return [pool[i % len(pool)] if hits[i] else build.text(k) for i in range(count)]


def _synthetic(o: LlmOptions, tok: Optional[Tokenizer], rng: np.random.Generator, count: int,
               info: Dict[str, Any]) -> List[Prompt]:
    import numpy as np

    dist = parse_dist(o.input_tokens) if o.input_tokens else parse_dist(str(o.prompt_words))
    lengths = dist.draw(rng, count)
    check_prompt_bytes(o, tok, int(lengths.sum()) + count * o.shared_prefix_tokens, count)
    out_dist = parse_dist(o.output_tokens) if o.output_tokens else None
    outs = out_dist.draw(rng, count) if out_dist else np.full(count, o.max_tokens)
    info.update(input_tokens=dist.describe(), output_tokens=out_dist.describe() if out_dist else
                {"spec": str(o.max_tokens), "kind": "fixed", "value": o.max_tokens})
    build = PromptBuilder(tok, rng)
    k = o.shared_prefix_tokens
    prefixes = sample_prefixes(o, build, count, info)
    prompts = []
    for i in range(count):
        text = build.text(int(lengths[i]), prefixes[i], k) if k else build.text(int(lengths[i]))
        prompts.append(Prompt(text, k + int(lengths[i]), int(outs[i])))
    return prompts


def request_body(o: LlmOptions, endpoint: str, model: Optional[str], p: Prompt, where: str,
                 extra: Dict[str, Any]) -> Dict[str, Any]:
    """The JSON body of one request for prompt ``p`` to ``endpoint``."""
    body: Dict[str, Any] = {"model": model}
    content: Content = p.content
    if endpoint == "embeddings":
        if not isinstance(content, str):
            raise ValueError(f"{where}: chat 'messages' cannot be sent to /v1/embeddings (give 'prompt')")
        body["input"] = content
        return {**body, **extra}
    if endpoint == "responses":
        return {**_responses_body(o, body, p, content), **extra}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": content}] if isinstance(content, str) else content
    elif isinstance(content, str):
        body["prompt"] = content
    else:
        raise ValueError(f"{where}: chat 'messages' need a /v1/chat/completions target")
    mt = p.max_tokens or o.max_tokens
    body["max_tokens"] = mt
    if o.ignore_eos:
        body.update(ignore_eos=True, min_tokens=mt)
    body["stream"] = o.stream
    if o.stream:
        body["stream_options"] = {"include_usage": True}
    return {**body, **extra}


def _responses_body(o: LlmOptions, body: Dict[str, Any], p: Prompt, content: Content) -> Dict[str, Any]:
    """A ``/v1/responses`` body: ``input`` (the prompt, or a message list as given),
    ``max_output_tokens`` and ``stream``."""
    body["input"] = content
    mt = p.max_tokens or o.max_tokens
    body["max_output_tokens"] = mt
    if o.ignore_eos:
        body.update(ignore_eos=True, min_tokens=mt)
    body["stream"] = o.stream
    return body


@dataclasses.dataclass
class WorkloadSetup:
    """What every workload builder starts from: ``--extra-body``, the tokenizer (and the
    length counter: tokens with one, else words), the seeded generator, the number of
    distinct prompts, and the result's ``llm`` description so far."""

    extra: Dict[str, Any]
    tok: Optional[Tokenizer]
    count_fn: Callable[[str], int]
    rng: np.random.Generator
    count: int
    info: Dict[str, Any]


def workload_setup(o: LlmOptions, endpoint: str) -> WorkloadSetup:
    """What every workload builder starts from, read from the options."""
    import numpy as np

    extra: Dict[str, Any] = json.loads(o.extra_body) if o.extra_body else {}
    if not isinstance(extra, dict):
        raise ValueError("--extra-body must be a JSON object")
    tok = load_tokenizer(o.tokenizer) if o.tokenizer else None
    count_fn: Callable[[str], int] = tok.count if tok is not None else (lambda s: len(s.split()))
    info: Dict[str, Any] = {"endpoint": endpoint, "tokenizer": o.tokenizer, "input_tokens_exact": tok is not None,
                            "stream": o.stream and endpoint != "embeddings", "ignore_eos": o.ignore_eos,
                            "extra_body": extra}
    return WorkloadSetup(extra, tok, count_fn, np.random.default_rng(o.seed), min(o.sample_count, MAX_PROMPTS), info)


def build_workload(o: LlmOptions, endpoint: str, model: Optional[str]) -> Workload:
    """The bodies for ``endpoint`` ("completions", "chat", "responses" or "embeddings") and ``model``.

    Raises:
        ValueError: a bad dataset, distribution, tokenizer or ``--extra-body``; the message
            names the option (and the file and line).
    """
    import numpy as np

    st = workload_setup(o, endpoint)
    extra, tok, count_fn, rng, count, info = st.extra, st.tok, st.count_fn, st.rng, st.count, st.info
    if o.dataset:
        prompts, layout, read = read_dataset(o.dataset, count_fn, tok is not None, o.dataset_min_input_tokens,
                                             o.dataset_max_input_tokens, count)
        if o.output_tokens:
            outs = parse_dist(o.output_tokens).draw(rng, len(prompts))
            for p, n in zip(prompts, outs):
                p.max_tokens = p.max_tokens or int(n)
        info.update(source="dataset", dataset=o.dataset, layout=layout, records_read=read,
                    records_used=len(prompts), min_input_tokens=o.dataset_min_input_tokens,
                    max_input_tokens=o.dataset_max_input_tokens or None)
        source = f"dataset {o.dataset} ({layout}, {len(prompts)} of {read} prompts)"
    else:
        prompts = _synthetic(o, tok, rng, count, info)
        info.update(source="synthetic", shared_prefix_tokens=o.shared_prefix_tokens,
                    prefix_groups=o.prefix_groups if o.shared_prefix_tokens else 0)
        source = f"synthetic ({len(prompts)} prompts, seed {o.seed})"
    if count < o.sample_count:
        source += f"; at most {MAX_PROMPTS} distinct prompts, sample indices wrap around them"
    where = f"--dataset {o.dataset}" if o.dataset else "--input-tokens"
    bodies = [request_body(o, endpoint, model, p, f"{where}: prompt {i + 1}", extra) for i, p in enumerate(prompts)]
    lengths = np.asarray([p.input_tokens for p in prompts], dtype=np.int64)
    info["prompts"] = {"input_tokens": length_stats(lengths),
                       "max_tokens": length_stats([max_tokens_of(b) for b in bodies if max_tokens_of(b)])}
    return Workload(bodies, lengths, info, source, add_images(o, endpoint, bodies, info))


def add_images(o: LlmOptions, endpoint: str, bodies: List[Dict[str, Any]], info: Dict[str, Any]) -> List[int]:
    """With ``--images``: the folder's images in ``bodies`` (chat bodies; a conversation's
    first turns), described in ``info["images"]``; each body's image bytes (empty without)."""
    if not o.images:
        return []
    if endpoint != "chat":
        raise ValueError(f"--images {o.images}: images go in chat messages; the target is not /v1/chat/completions")
    images = load_images(o.images)
    out = attach_images(bodies, images, o.images_per_request, o.seed, MAX_PROMPT_BYTES,
                        f"--images {o.images} with --images-per-request {o.images_per_request}")
    info["images"] = images.describe(o.images_per_request)
    return out
