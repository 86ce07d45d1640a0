"""MkDocs hooks of the documentation site (mkdocs.yml: hooks)."""

from __future__ import annotations

import re
from typing import Any

CODE_SPAN = re.compile(r"`[^`\n]+`")


def on_page_markdown(markdown: str, **_: Any) -> str:
    """A table cell's code span writes a pipe as ``\\|`` (GitHub's table rule, which keeps it
    out of the cell split and shows ``|``); Python-Markdown's tables already leave pipes in
    code spans alone and would show the backslash, so it is dropped there."""
    return "\n".join(CODE_SPAN.sub(lambda m: m.group(0).replace("\\|", "|"), line)
                     if line.startswith("|") else line for line in markdown.split("\n"))
