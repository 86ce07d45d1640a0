"""The shell blocks of README.md and docs/*.md, as tests/test_docs.py checks them and
tests/integration/test_docs_commands.py runs them.

Every shell and Python block runs, as written: ```bash and ```sh blocks
whole, ```console blocks their "$ " commands (with the lines that continue them; the
other lines are output), ```python blocks as a script each (with the test's Python, in
the page's folder). An untyped block is output or a tree, never commands: one
with a line that starts like a command fails the test until it is typed. The line
before a block may say how it runs:
  <!-- exit: 1 -->                the exit status it ends with (several: "0 or 3")
  <!-- not run: WHY -->           it does not run here, and why (the test lists them)
  <!-- with: SERVER:PORT ... -->  it runs with the tests' scripted servers standing in for
                                  real ones on the ports it names: "scripted" is
                                  tests/servers/scripted.py (KServe v2 REST, OpenAI,
                                  /metrics), "scripted-grpc" tests/servers/grpc_scripted.py
A block that is a file, whose first line is a comment with its name ("# instances.toml"),
is written to that file before the blocks after it run.
A page's blocks run in order in one folder of their own (later blocks read what earlier
ones wrote), beside links to the source tree's folders, with `loadgen` (the console
script pip installs) and tests/doc_pip.py as `pip` first on the PATH.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"

SHELL_LANGS = ("bash", "sh", "console")
RUN_LANGS = (*SHELL_LANGS, "python")
NOT_RUN = re.compile(r"^<!-- not run: (\S.*?) -->$")
EXIT = re.compile(r"^<!-- exit: (\d+(?: or \d+)*)(?:[:;,] \S.*?)? -->$")
COMMAND_LIKE = re.compile(r"^\s*(?:\$ |(?:python3?|loadgen|pip|bash|sh|docker|kubectl|argo|curl|mkdocs|pytest"
                          r"|export)\s)")
WITH = re.compile(r"^<!-- with: ((?:scripted|scripted-grpc):\d+(?: (?:scripted|scripted-grpc):\d+)*) -->$")
FILE_NAME = re.compile(r"^(?:#|//) ([\w.-]+\.(?:toml|json|jsonl|yaml|yml|py|txt|conf))$")


def pages() -> List[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def numbered_blocks(text: str) -> List[Tuple[int, str, str, str]]:
    """(the fence's line number, language, body, the line before the fence) of every
    fenced block, in order; a block indented in a list item has that indent taken off."""
    blocks, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        m = re.match(r"^( *)```(\S*)\s*$", lines[i])
        if m is None:
            i += 1
            continue
        indent = m.group(1)
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith(indent + "```"))
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        body = "\n".join(line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines[i + 1:end])
        blocks.append((i + 1, m.group(2), body + "\n", before.strip()))
        i = end + 1
    return blocks


@dataclass(frozen=True)
class Block:
    """One fenced block of a page."""

    page: Path
    line: int  # the opening fence's
    lang: str
    body: str
    mark: str  # the line before the fence

    @property
    def where(self) -> str:
        page = self.page.relative_to(ROOT) if ROOT in self.page.parents else self.page.name
        return f"{page}:{self.line}"

    @property
    def is_shell(self) -> bool:
        return self.lang in SHELL_LANGS

    @property
    def runs(self) -> bool:
        """Whether the block is run (a shell or Python block), unless marked not run."""
        return self.lang in RUN_LANGS

    @property
    def not_run(self) -> Optional[str]:
        m = NOT_RUN.match(self.mark)
        return m.group(1) if m else None

    @property
    def exit_codes(self) -> Tuple[int, ...]:
        m = EXIT.match(self.mark)
        return tuple(int(code) for code in m.group(1).split(" or ")) if m else (0,)

    @property
    def servers(self) -> List[Tuple[str, int]]:
        m = WITH.match(self.mark)
        return [(name, int(port)) for name, _, port in (s.partition(":") for s in m.group(1).split())] if m else []

    @property
    def file(self) -> Optional[str]:
        """The file a block that is not commands shows, when its first line names it."""
        m = FILE_NAME.match(self.body.split("\n")[0])
        return m.group(1) if m and not self.runs else None

    def script(self, python: str = "python") -> str:
        """The block as a bash script; a Python block through ``python`` (its body on
        standard input)."""
        if self.lang == "python":
            return f"{shlex.quote(python)} - <<'LOADGEN_DOC_PYTHON'\n{self.body}LOADGEN_DOC_PYTHON\n"
        return console_commands(self.body) if self.lang == "console" else self.body


def console_commands(body: str) -> str:
    """The commands of a console transcript: each line that starts with "$ ", with the
    lines after it while the command is unfinished (a trailing backslash, an open quote)."""
    commands: List[str] = []
    current: Optional[List[str]] = None
    for line in body.split("\n"):
        if current is not None:
            current.append(line)
        elif line.startswith("$ "):
            current = [line[2:]]
        else:
            continue
        if not unfinished("\n".join(current)):
            commands.append("\n".join(current))
            current = None
    assert current is None, f"an unfinished command: {current}"
    assert commands, f"a console block without a '$ ' command:\n{body}"
    return "\n".join(commands) + "\n"


def unfinished(command: str) -> bool:
    if command.endswith("\\"):
        return True
    try:
        shlex.split(command, comments=True)
    except ValueError:  # no closing quotation
        return True
    return False


def doc_blocks(page: Path) -> List[Block]:
    return [Block(page, line, lang, body, before)
            for line, lang, body, before in numbered_blocks(page.read_text(encoding="utf-8"))]


def shell_blocks(page: Path) -> List[Block]:
    return [b for b in doc_blocks(page) if b.is_shell]


def run_blocks(page: Path) -> List[Block]:
    """The page's shell and Python blocks (those marked not run too)."""
    return [b for b in doc_blocks(page) if b.runs]


def not_run_blocks() -> List[Block]:
    return [b for page in pages() for b in run_blocks(page) if b.not_run]
