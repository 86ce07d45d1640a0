"""The documentation: the site builds with ``mkdocs build --strict`` (links, anchors and the
API reference's docstrings checked), every relative link of README.md and docs/*.md leads
somewhere, and every shell command they show runs as written.

A page's shell blocks (```bash, ```sh, ```console) run one after another in one temporary
folder (later ones read what earlier ones wrote), one test per page and the README's tour
with checks of its own; each runs in a session of its own, bounded in time, and whatever it
left running is stopped by that session's id. The rules, and the marks a page may put on
the line before a block, are at "the commands" below.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from tests.helpers import clean_env
from tests.servers.scripted_proc import start_scripted

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
REPO_URL = re.compile(r"^https://github\.com/loadgen-project/loadgen/(?:blob|tree)/main/([^#?]+)")
# The generator-overload rule is loadgen judging its own lateness; on a shared 2-core test
# host that says INVALID for reasons of the host, so the tour's runs get the tests' margin.
TOUR_ENV = {"LOADGEN_MAX_ISSUE_DELAY_MS": "100"}


# ------------------------------------------------------------------------ markdown

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


def unfenced(text: str) -> str:
    """The text without its fenced blocks."""
    return re.sub(r"^```.*?^```[^\n]*$", "", text, flags=re.MULTILINE | re.DOTALL)


def prose(text: str) -> str:
    """The text without fenced blocks and code spans (links there are not links)."""
    return re.sub(r"`[^`\n]*`", "", unfenced(text))


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it (and the site, through pymdownx.slugs)."""
    heading = re.sub(r"`([^`]*)`", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", heading).replace(" ", "-")


def anchors(path: Path) -> set:
    text = unfenced(path.read_text(encoding="utf-8"))
    return {slug(h) for h in re.findall(r"^#{1,6} (.+?)\s*#*$", text, flags=re.MULTILINE)}


def broken_links(path: Path) -> List[str]:
    """Each relative link (or link into this repository's tree on GitHub) of the markdown
    file ``path`` whose file or anchor does not exist, with why."""
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", prose(path.read_text(encoding="utf-8"))):
        repo = REPO_URL.match(target)
        if repo:
            dest, anchor = ROOT / repo.group(1), ""
        elif re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # another site
        else:
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"{path.name}: {target}: no such file")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            bad.append(f"{path.name}: {target}: no such heading")
    return bad


def pages() -> List[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


# ------------------------------------------------------------------------- the site

def test_the_site_builds_strictly(tmp_path):
    if importlib.util.find_spec("mkdocs") is None and not os.environ.get("LOADGEN_REQUIRE_SERVERS"):
        pytest.skip("mkdocs is not installed (pip install '.[docs]')")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    for name in ("loadgen.run", "loadgen.result.Result", "loadgen.Engine", "loadgen.EngineSettings",
                 "loadgen.Histogram", "loadgen.load_results", "loadgen.load_sweep", "loadgen.mlperf"):
        assert f'id="{name}"' in api, f"the API reference has no {name}"
    assert "Runs once and returns what it measured" in api  # drawn from loadgen.run's docstring


def test_every_page_is_in_the_site_nav():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in DOCS.glob("*.md"):
        assert f": {page.name}\n" in nav, f"mkdocs.yml's nav leaves out {page.name}"


# ------------------------------------------------------------------------------ links

def test_every_relative_link_resolves():
    bad = [problem for page in pages() for problem in broken_links(page)]
    assert not bad, "\n".join(bad)


TREE_PATH = re.compile(r"(?<![\w/.-])(?:tests|scripts|bench|examples|deploy|csrc|bindings|loadgen)/"
                       r"[\w/.-]*\.(?:py|sh|md|cc|h|yaml|json|proto|toml)\b")


def test_every_file_of_the_tree_the_pages_name_exists():
    missing = [f"{page.name}: {path}" for page in pages()
               for path in sorted(set(TREE_PATH.findall(page.read_text(encoding="utf-8"))))
               if not (ROOT / path).exists()]
    assert not missing, "\n".join(missing)


def test_the_link_check_finds_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n[ok](#a-page) [gone](missing.md) [no heading](#nowhere) "
                    "`[code](not-a-link.md)` [tree](https://github.com/loadgen-project/loadgen/blob/main/nope.py)\n")
    assert broken_links(page) == ["page.md: missing.md: no such file", "page.md: #nowhere: no such heading",
                                  "page.md: https://github.com/loadgen-project/loadgen/blob/main/nope.py: no such file"]


# ------------------------------------------------------------------------ the commands
#
# Every shell block of README.md and docs/*.md runs, as written: ```bash and ```sh blocks
# whole, ```console blocks their "$ " commands (with the lines that continue them; the
# other lines are output). An untyped block is output or a tree, never commands: one
# with a line that starts like a command fails the test until it is typed. The line
# before a block may say how it runs:
#   <!-- exit: 1 -->                the exit status it ends with (several: "0 or 3")
#   <!-- not run: WHY -->           it does not run here, and why (the test lists them)
#   <!-- with: SERVER:PORT ... -->  it runs with the tests' scripted servers standing in for
#                                   real ones on the ports it names: "scripted" is
#                                   tests/servers/scripted.py (KServe v2 REST, OpenAI,
#                                   /metrics), "scripted-grpc" tests/servers/grpc_scripted.py
# A block that is a file, whose first line is a comment with its name ("# instances.toml"),
# is written to that file before the blocks after it run.
# A page's blocks run in order in one folder of their own (later blocks read what earlier
# ones wrote), beside links to the source tree's folders, with `loadgen` (the console
# script pip installs) and tests/doc_pip.py as `pip` first on the PATH.

SHELL_LANGS = ("bash", "sh", "console")
NOT_RUN = re.compile(r"^<!-- not run: (\S.*?) -->$")
EXIT = re.compile(r"^<!-- exit: (\d+(?: or \d+)*)(?:[:;,] \S.*?)? -->$")
COMMAND_LIKE = re.compile(r"^\s*(?:\$ |(?:python3?|loadgen|pip|bash|sh|docker|kubectl|argo|curl|mkdocs|pytest"
                          r"|export)\s)")
WITH = re.compile(r"^<!-- with: ((?:scripted|scripted-grpc):\d+(?: (?:scripted|scripted-grpc):\d+)*) -->$")
FILE_NAME = re.compile(r"^(?:#|//) ([\w.-]+\.(?:toml|json|jsonl|yaml|yml|py|txt))$")
TREE_LINKS = ("tests", "scripts", "bench", "examples", "deploy", "docs", "mkdocs.yml", "pyproject.toml",
              "README.md")
BLOCK_TIMEOUT_S = 120


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
        return m.group(1) if m and not self.is_shell else None

    def script(self) -> str:
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


def run_block(body: str, cwd: Path, env: Dict[str, str], timeout: float = BLOCK_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Runs ``body`` with ``bash -e`` from ``cwd`` in a session of its own, to the end of
    that shell; whatever of the session is still running then (a server it started in the
    background) is stopped. The output goes through a file: a process left running would
    hold a pipe open."""
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as log:
        proc = subprocess.Popen(["bash", "-e", "-c", body], cwd=cwd, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL if proc.returncode is None else signal.SIGTERM)
            except ProcessLookupError:
                pass
            proc.wait()
        log.seek(0)
        out = log.read()
    if timed_out:
        pytest.fail(f"timed out after {timeout} s:\n{body}\n{out}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def page_folder(tmp_path: Path) -> Tuple[Path, Dict[str, str]]:
    """A folder for one page's commands (links to the source tree's folders beside them),
    and their environment: `loadgen` and `pip` (tests/doc_pip.py) first on the PATH."""
    folder, bin_dir = tmp_path / "page", tmp_path / "bin"
    folder.mkdir(parents=True)
    bin_dir.mkdir()
    for name in TREE_LINKS:
        (folder / name).symlink_to(ROOT / name, target_is_directory=(ROOT / name).is_dir())
    scripts = {"loadgen": f"#!{sys.executable}\nimport sys\nfrom loadgen.cli import main\nsys.exit(main())\n",
               "pip": f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(ROOT / 'tests' / 'doc_pip.py'))} \"$@\"\n"}
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return folder, clean_env(**TOUR_ENV, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")


def run_page(page: Path, tmp_path: Path) -> Path:
    """Runs the page's shell blocks that are not marked "not run", in order, in one
    folder, each to the exit status it declares; returns the folder."""
    folder, env = page_folder(tmp_path)
    for block in doc_blocks(page):
        if block.file:
            (folder / block.file).write_text(block.body, encoding="utf-8")
        if not block.is_shell or block.not_run:
            continue
        with contextlib.ExitStack() as servers:
            for name, port in block.servers:
                if name == "scripted":
                    servers.enter_context(start_scripted(tmp_path, "--port", port))
                else:
                    from tests.servers.grpc_scripted import ScriptedGrpc  # grpcio: the test extra

                    servers.enter_context(ScriptedGrpc(port=port))
            proc = run_block(block.script(), folder, env)
        assert proc.returncode in block.exit_codes, (
            f"{block.where}: exit {proc.returncode}, not {' or '.join(map(str, block.exit_codes))}:\n"
            f"{block.body}\n{proc.stdout}")
    return folder


def pages_with_commands() -> List[Path]:
    return [page for page in sorted(DOCS.glob("*.md"))
            if any(not b.not_run for b in shell_blocks(page))]


@pytest.mark.parametrize("page", pages_with_commands(), ids=lambda p: p.name)
def test_the_commands_of_the_page_run_as_written(page, tmp_path):
    run_page(page, tmp_path)


def test_no_untyped_block_holds_commands():
    bad = [f"{b.where}: {line}" for page in pages() for b in doc_blocks(page) if not b.lang
           for line in b.body.split("\n") if COMMAND_LIKE.match(line)][:20]
    assert not bad, "commands in untyped blocks (make them ```bash, or ```console with '$ ' prompts):\n" + "\n".join(bad)


def test_every_mark_is_one_the_test_reads():
    bad = [f"{b.where}: {b.mark}" for page in pages() for b in doc_blocks(page)
           if b.mark.startswith("<!--") and not (b.is_shell and any(m.match(b.mark) for m in (NOT_RUN, EXIT, WITH)))]
    assert not bad, "\n".join(bad)


def not_run_blocks() -> List[Block]:
    return [b for page in pages() for b in shell_blocks(page) if b.not_run]


@pytest.mark.parametrize("block", not_run_blocks(), ids=lambda b: b.where)
def test_a_block_not_run_says_why(block):
    """Listed with its reason as a skip; the manifests a kubectl command applies exist (and
    tests/integration/test_deploy.py validates every one under deploy/)."""
    if "kubectl" in block.body:
        for path in re.findall(r"(?:-f |\s)(\S+\.ya?ml)\b", block.body):
            assert path.startswith("deploy/") and list(ROOT.glob(path)), f"{block.where}: no {path}"
    pytest.skip(f"{block.where}: not run: {block.not_run}")


def test_the_console_commands_are_read_with_their_continuations():
    body = ("$ python -c \"\nprint('a')\"\noutput\n$ loadgen run \\\n    --sut demo\n...\n"
            "$ echo '# not a comment'  # a comment's quote: don't\n")
    assert console_commands(body) == ("python -c \"\nprint('a')\"\nloadgen run \\\n    --sut demo\n"
                                      "echo '# not a comment'  # a comment's quote: don't\n")


def test_a_mark_sets_the_exit_status_or_says_why_not(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```bash\ntrue\n```\n<!-- exit: 1 -->\n\n```sh\nfalse\n```\n"
                    "<!-- exit: 0 or 3: 3 without a GPU -->\n```console\n$ exit 3\n```\n"
                    "<!-- not run: needs a cluster -->\n```bash\nkubectl get pods\n```\n```\npython x.py\n```\n")
    blocks = doc_blocks(page)
    assert [(b.lang, b.exit_codes, b.not_run) for b in blocks] == [
        ("bash", (0,), None), ("sh", (1,), None), ("console", (0, 3), None),
        ("bash", (0,), "needs a cluster"), ("", (0,), None)]


def test_a_page_runs_in_order_with_the_files_it_shows(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```toml\n# points.toml\npoints = 1\n```\n```bash\ngrep -q 'points = 1' points.toml\n"
                    "echo made > made.txt\n```\n```console\n$ test \"$(cat made.txt)\" = made\nno output here\n```\n"
                    "<!-- exit: 1 -->\n```bash\nfalse\n```\n<!-- not run: never -->\n```bash\nexit 9\n```\n")
    folder = run_page(page, tmp_path)
    assert (folder / "points.toml").read_text() == "# points.toml\npoints = 1\n"
    page.write_text("<!-- with: scripted:0 -->\n```bash\ntrue\n```\n```bash\nexit 4\n```\n")
    assert doc_blocks(page)[0].servers == [("scripted", 0)]
    with pytest.raises(AssertionError, match=r"page.md:5: exit 4, not 0"):
        run_page(page, tmp_path / "again")


def test_the_test_pip_checks_and_installs_nothing(tmp_path):
    _, env = page_folder(tmp_path)
    ok = run_block("pip install -e . && pip install '.[test]' numpy", tmp_path, env, timeout=60)
    assert ok.returncode == 0 and "Requirement already satisfied" in ok.stdout, ok.stdout
    gone = run_block("pip install 'no-such-package-here==1.0'", tmp_path, env, timeout=60)
    assert gone.returncode == 1 and "lacks no-such-package-here==1.0 (not installed)" in gone.stdout, gone.stdout
    assert run_block("pip install '.[no-such-extra]'", tmp_path, env, timeout=60).returncode == 1
    assert run_block("pip uninstall loadgen", tmp_path, env, timeout=60).returncode == 2


# ------------------------------------------------------------------------ the README

def test_the_readme_starts_with_the_two_set_up_commands():
    first = shell_blocks(README)[0]
    assert README.read_text(encoding="utf-8").startswith(f"# loadgen\n\n{first.mark}\n\n```bash\n{first.body}")
    assert first.body == "pip install -e . && python -m loadgen run\npip install '.[test]' && pytest\n"
    assert shell_blocks(DOCS / "index.md")[0].body == first.body, "the getting-started page starts with them too"


def test_the_first_set_up_command_runs_the_demo_benchmark(tmp_path):
    # Its pip half runs as the test pip (the environment has it); `pytest` is this suite.
    folder, env = page_folder(tmp_path)
    proc = run_block(shell_blocks(README)[0].body.split("\n")[0], folder, env, timeout=180)
    assert proc.returncode in (0, 1), proc.stdout  # 1: INVALID, a verdict like VALID
    assert re.search(r"^(VALID|INVALID)  server on demo: ", proc.stdout, flags=re.MULTILINE), proc.stdout


def test_the_readme_tour_runs_as_written(tmp_path):
    tour = [b.body for b in shell_blocks(README) if not b.not_run]
    assert len(tour) >= 4, "the tour: a run, a network target, a sweep, a report"
    folder = run_page(README, tmp_path)
    for path in ("runs/first/result.json", "runs/first/report.html", "runs/kserve/result.json",
                 "runs/llm/result.json", "runs/sweep/sweep.jsonl", "runs/sweep.html", "runs/servers.html"):
        assert (folder / path).is_file(), f"the tour wrote no {path}"
    text = README.read_text(encoding="utf-8")
    for needle in ("loadgen.load_sweep", "loadgen report", "--html", "--sut http", "openai+http"):
        assert needle in "".join(tour), f"the tour lost its {needle} command"
    assert "python -m loadgen run --sut demo" in text
