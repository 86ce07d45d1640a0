"""Tool definitions of an OpenAI run (``--tools FILE``, ``--tool-choice``).

The file holds an OpenAI ``tools`` array (or an object with one under ``"tools"``): each
tool is a function, in the chat form ``{"type": "function", "function": {"name", ...}}``
or the Responses API's flat form ``{"type": "function", "name", ...}``; each request
carries them in its target's form, with ``tool_choice``. A function may carry
``"x-result"``: the text its call's result is when a conversation (``--turns``) feeds the
calls' results back; without it the result is :data:`DEFAULT_TOOL_RESULT`. ``x-result``
is never sent.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict, List, Optional

from loadgen.files import TOOLS_LIMIT_BYTES, InputFileError, read_text

__all__ = ["DEFAULT_TOOL_RESULT", "TOOL_CHOICES", "Tools", "check_tools_file", "load_tools"]

#: A tool call's result fed back in a conversation when its function has no ``x-result``.
DEFAULT_TOOL_RESULT = '{"result": "ok"}'
#: The ``--tool-choice`` words; any other value names the function to call.
TOOL_CHOICES = ("auto", "none", "required")


@dataclasses.dataclass
class Tools:
    """The run's tools: each as a name, its definition (the function's fields less
    ``x-result``) and its call's result text, and the ``tool_choice``."""

    names: List[str]
    functions: List[Dict[str, Any]]
    results: Dict[str, str]
    choice: str = "auto"

    def body_fields(self, endpoint: str) -> Dict[str, Any]:
        """``tools`` and ``tool_choice`` of a request to ``endpoint`` ("responses": the
        flat form; else the chat form)."""
        if endpoint == "responses":
            tools: List[Dict[str, Any]] = [{"type": "function", **f} for f in self.functions]
        else:
            tools = [{"type": "function", "function": dict(f)} for f in self.functions]
        choice: Any = self.choice
        if choice not in TOOL_CHOICES:
            choice = ({"type": "function", "name": choice} if endpoint == "responses"
                      else {"type": "function", "function": {"name": choice}})
        return {"tools": tools, "tool_choice": choice}

    def result(self, name: str) -> str:
        """The result text of a call of function ``name``."""
        return self.results.get(name, DEFAULT_TOOL_RESULT)


def _function_of(item: Any, i: int, where: str) -> Dict[str, Any]:
    if not isinstance(item, dict):
        raise ValueError(f"{where}: tool {i + 1} is not a JSON object")
    if item.get("type", "function") != "function":
        raise ValueError(f"{where}: tool {i + 1} has type {item.get('type')!r}; only \"function\" tools are sent")
    fn = item.get("function") if "function" in item else {k: v for k, v in item.items() if k != "type"}
    if not isinstance(fn, dict):
        raise ValueError(f"{where}: tool {i + 1}: 'function' is not a JSON object")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: tool {i + 1} has no function 'name'")
    params = fn.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise ValueError(f"{where}: tool {i + 1} ({name}): 'parameters' is not a JSON object")
    return fn


def load_tools(path: str, choice: Optional[str] = None, where: str = "") -> Tools:
    """The tools of ``--tools path``, with ``--tool-choice choice`` (default "auto");
    errors start with ``where`` (default: ``--tools path``).

    Raises:
        ValueError: the file cannot be read, is not JSON, holds no tools array, a tool is
            not a named function, or ``choice`` names no function of the file; the message
            names the file and what is wrong.
    """
    where = where or f"--tools {path}"
    try:
        text = read_text(path, what=where, limit_bytes=TOOLS_LIMIT_BYTES)
    except InputFileError as e:
        raise ValueError(f"{where}: {e.problem}") from None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{where}: not JSON ({e})") from None
    items = doc.get("tools") if isinstance(doc, dict) else doc
    if not isinstance(items, list) or not items:
        raise ValueError(f"{where}: not an OpenAI tools array (a JSON list of function tools, or an object "
                         "with one under \"tools\")")
    names: List[str] = []
    functions: List[Dict[str, Any]] = []
    results: Dict[str, str] = {}
    for i, item in enumerate(items):
        fn = _function_of(item, i, where)
        name = str(fn["name"])
        if name in names:
            raise ValueError(f"{where}: tool {i + 1}: function {name!r} is defined twice")
        if "x-result" in fn:
            r = fn["x-result"]
            results[name] = r if isinstance(r, str) else json.dumps(r)
        names.append(name)
        functions.append({k: v for k, v in fn.items() if k != "x-result"})
    choice = choice or "auto"
    if choice not in TOOL_CHOICES and choice not in names:
        raise ValueError(f"--tool-choice {choice}: not auto, none, required or a function of --tools {path} "
                         f"({', '.join(names)})")
    return Tools(names, functions, results, choice)


def check_tools_file(path: Any) -> str:
    """``--tools``'s converter: the path, once its file reads as tools."""
    load_tools(str(path), where=str(path))
    return str(path)
