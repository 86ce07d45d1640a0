"""``--dataset FILE``: prompts from a file, read before the run.

Two layouts, told apart by the first character of the file:

- JSON lines: one object per line, ``{"prompt": "..."}`` (a completions body; on a chat
  target it becomes one user message) or ``{"messages": [{"role": ..., "content": ...}]}``
  (a chat body), with an optional positive integer ``"max_tokens"``;
- ShareGPT JSON (the file starts with ``[``): a list of ``{"conversations": [{"from":
  "human"|"gpt", "value": ...}, ...]}``; the first human turn is the prompt, and, when a
  tokenizer is given, the token count of the first gpt turn after it is the record's
  ``max_tokens`` (as the common serving benchmarks do). Entries with no such pair are
  skipped.

With ``--turns N`` (:func:`read_conversations`), a ShareGPT entry gives up to N human
turns, each followed by a gpt turn, and a JSON line is ``{"turns": ["...", ...]}`` (a
``{"prompt"}`` line is a one-turn conversation).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from loadgen.files import DATASET_LIMIT_BYTES, read_text
from loadgen.llm.dist import MAX_REQUEST_TOKENS

__all__ = ["Prompt", "read_conversations", "read_dataset"]

Content = Union[str, List[Dict[str, Any]]]


@dataclasses.dataclass
class Prompt:
    """One prompt: its text or chat messages, its input tokens and its own max_tokens."""

    content: Content
    input_tokens: int
    max_tokens: Optional[int] = None


def _text_of(content: Content) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(str(m.get("content", "")) for m in content)


def _messages(value: Any, where: str) -> List[Dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}: 'messages' must be a non-empty list of {{\"role\", \"content\"}} objects")
    for m in value:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"{where}: each message must be an object with string 'role' and 'content'")
    return value


def _object_line(line: str, where: str) -> Dict[str, Any]:
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{where}: not JSON ({e})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: not a JSON object")
    return obj


def _max_tokens(obj: Dict[str, Any], where: str) -> Optional[int]:
    mt = obj.get("max_tokens")
    if mt is not None and (isinstance(mt, bool) or not isinstance(mt, int) or not 1 <= mt <= MAX_REQUEST_TOKENS):
        shown = repr(mt) if len(repr(mt)) <= 40 else f"a number of {len(str(mt))} digits"
        raise ValueError(f"{where}: 'max_tokens' must be an integer in 1..{MAX_REQUEST_TOKENS}, got {shown}")
    return mt


def _jsonl_record(line: str, where: str) -> Tuple[Content, Optional[int]]:
    obj = _object_line(line, where)
    if "prompt" in obj:
        content: Content = obj["prompt"]
        if not isinstance(content, str) or not content:
            raise ValueError(f"{where}: 'prompt' must be a non-empty string")
    elif "messages" in obj:
        content = _messages(obj["messages"], where)
    else:
        raise ValueError(f"{where}: has neither 'prompt' nor 'messages'")
    return content, _max_tokens(obj, where)


def _sharegpt(doc: Any, path: str, count: Callable[[str], int], exact: bool) -> List[Tuple[Content, Optional[int]]]:
    if not isinstance(doc, list):
        raise ValueError(f"--dataset {path}: a JSON dataset must be a list of {{\"conversations\": [...]}} (ShareGPT)")
    out: List[Tuple[Content, Optional[int]]] = []
    for i, entry in enumerate(doc):
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list):
            raise ValueError(f"--dataset {path}: entry {i} has no 'conversations' list")
        prompt = reply = None
        for t in turns:
            if not isinstance(t, dict) or not isinstance(t.get("value"), str):
                raise ValueError(f"--dataset {path}: entry {i}: each turn needs 'from' and a string 'value'")
            if prompt is None and t.get("from") == "human" and t["value"]:
                prompt = t["value"]
            elif prompt is not None and t.get("from") == "gpt":
                reply = t["value"]
                break
        if prompt is None or reply is None:
            continue
        out.append((prompt, max(1, count(reply)) if exact else None))
    return out


def _read_text(path: str) -> str:
    """The dataset's text, at most :data:`loadgen.files.DATASET_LIMIT_BYTES`."""
    return read_text(path, what="--dataset", limit_bytes=DATASET_LIMIT_BYTES)


def _load_sharegpt(text: str, path: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"--dataset {path}: not valid JSON ({e})") from None


def _sharegpt_turns(doc: Any, path: str, count: Callable[[str], int], exact: bool,
                    turns: int) -> List[List[Tuple[str, Optional[int]]]]:
    """Each conversation's first ``turns`` human turns, each with the token count of the
    gpt reply after it as its max_tokens (with a tokenizer; else None)."""
    if not isinstance(doc, list):
        raise ValueError(f"--dataset {path}: a JSON dataset must be a list of {{\"conversations\": [...]}} (ShareGPT)")
    out: List[List[Tuple[str, Optional[int]]]] = []
    for i, entry in enumerate(doc):
        items = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(items, list):
            raise ValueError(f"--dataset {path}: entry {i} has no 'conversations' list")
        conv: List[Tuple[str, Optional[int]]] = []
        pending: Optional[str] = None
        for t in items:
            if not isinstance(t, dict) or not isinstance(t.get("value"), str):
                raise ValueError(f"--dataset {path}: entry {i}: each turn needs 'from' and a string 'value'")
            if t.get("from") == "human" and t["value"] and pending is None:
                pending = t["value"]
            elif t.get("from") == "gpt" and pending is not None:
                conv.append((pending, max(1, count(t["value"])) if exact else None))
                pending = None
                if len(conv) >= turns:
                    break
        if conv:
            out.append(conv)
    return out


def _jsonl_turns(line: str, where: str) -> Tuple[List[str], Optional[int]]:
    """A multi-turn JSON line: ``{"turns": ["...", ...]}`` (or a one-turn ``{"prompt"}``)."""
    obj = _object_line(line, where)
    if "turns" in obj:
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns or not all(isinstance(x, str) and x for x in turns):
            raise ValueError(f"{where}: 'turns' must be a non-empty list of non-empty strings (the user's turns)")
    elif isinstance(obj.get("prompt"), str) and obj["prompt"]:
        turns = [obj["prompt"]]
    else:
        raise ValueError(f"{where}: with --turns, a JSON line needs 'turns': [\"...\", ...] (or one 'prompt'); "
                         "a 'messages' line is a single request")
    return turns, _max_tokens(obj, where)


def read_conversations(path: str, count: Callable[[str], int], exact: bool, turns: int, min_tokens: int = 0,
                       max_tokens: int = 0, limit: int = 0) -> Tuple[List[List[Prompt]], str, int]:
    """Multi-turn conversations of a dataset file: ShareGPT conversations (up to ``turns``
    human turns each) or JSON lines of ``{"turns": [...]}``; kept when the first turn's
    length is within ``min_tokens``..``max_tokens`` (as :func:`read_dataset`), the first
    ``limit`` (0: all).

    Returns:
        (conversations as lists of user-turn prompts, layout, records read).
    """
    text = _read_text(path)
    records: List[List[Tuple[str, Optional[int]]]]
    if text.lstrip().startswith("["):
        layout = "sharegpt"
        records = _sharegpt_turns(_load_sharegpt(text, path), path, count, exact, turns)
    else:
        layout = "jsonl"
        records = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                ts, mt = _jsonl_turns(line, f"--dataset {path}: line {n}")
                records.append([(x, mt) for x in ts[:turns]])
    kept: List[List[Prompt]] = []
    for conv in records:
        first = count(conv[0][0])
        if first >= min_tokens and (max_tokens <= 0 or first <= max_tokens):
            kept.append([Prompt(x, count(x), mt) for x, mt in conv])
            if limit and len(kept) >= limit:
                break
    if not kept:
        raise ValueError(f"--dataset {path}: no conversation left ({len(records)} read, none whose first turn has "
                         f"{min_tokens}..{max_tokens or 'any'} input {'tokens' if exact else 'words'})")
    return kept, layout, len(records)


def read_dataset(path: str, count: Callable[[str], int], exact: bool, min_tokens: int = 0,
                 max_tokens: int = 0, limit: int = 0) -> Tuple[List[Prompt], str, int]:
    """The prompts of a dataset file (module doc), their input lengths counted with
    ``count`` (tokens when ``exact``, else words), kept when ``min_tokens <= length`` and
    (``max_tokens`` > 0) ``length <= max_tokens``, the first ``limit`` (0: all) of them.

    Returns:
        (prompts, layout "jsonl" or "sharegpt", records read).

    Raises:
        ValueError: unreadable file, a bad line (named by number), or nothing kept.
    """
    text = _read_text(path)
    records: List[Tuple[Content, Optional[int]]]
    if text.lstrip().startswith("["):
        layout = "sharegpt"
        records = _sharegpt(_load_sharegpt(text, path), path, count, exact)
    else:
        layout = "jsonl"
        records = [_jsonl_record(line, f"--dataset {path}: line {n}")
                   for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    kept: List[Prompt] = []
    for content, mt in records:
        n = count(_text_of(content))
        if n >= min_tokens and (max_tokens <= 0 or n <= max_tokens):
            kept.append(Prompt(content, n, mt))
            if limit and len(kept) >= limit:
                break
    if not kept:
        raise ValueError(f"--dataset {path}: no prompt left ({len(records)} read, none with "
                         f"{min_tokens}..{max_tokens or 'any'} input {'tokens' if exact else 'words'})")
    return kept, layout, len(records)
