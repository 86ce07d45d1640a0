"""Every shell command and Python block of README.md and docs/*.md runs as written (the rules and marks:
tests/docs_pages.py); the README's tour and set-up commands, with checks of their own.

A page's shell and Python blocks run one after another in one temporary folder (later ones read what
earlier ones wrote), one test per page; each runs in a session of its own, bounded in time,
and whatever it left running is stopped by that session's id.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import pytest

from tests.docs_pages import DOCS, README, ROOT, Block, doc_blocks, run_blocks, shell_blocks
from tests.helpers import clean_env
from tests.servers.scripted_proc import start_scripted

# The generator-overload rule is loadgen judging its own lateness; on a shared 2-core test
# host that says INVALID for reasons of the host, so the docs' runs get the tests' margin.
TOUR_ENV = {"LOADGEN_MAX_ISSUE_DELAY_MS": "100"}
TREE_LINKS = ("tests", "scripts", "bench", "examples", "deploy", "docs", "mkdocs.yml", "pyproject.toml",
              "README.md")
BLOCK_TIMEOUT_S = 120


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


def run_page(page: Path, tmp_path: Path, only: Optional[Callable[[Block], bool]] = None) -> Path:
    """Runs the page's shell and Python blocks that are not marked "not run" (of those,
    the ones ``only`` keeps, when given), in order, in one folder, each to the exit status
    it declares; returns the folder."""
    folder, env = page_folder(tmp_path)
    for block in doc_blocks(page):
        if block.file:
            (folder / block.file).write_text(block.body, encoding="utf-8")
        if not block.runs or block.not_run or (only is not None and not only(block)):
            continue
        with contextlib.ExitStack() as servers:
            for name, port in block.servers:
                if name == "scripted":
                    servers.enter_context(start_scripted(tmp_path, "--port", port))
                else:
                    from tests.servers.grpc_scripted import ScriptedGrpc  # grpcio: the test extra

                    servers.enter_context(ScriptedGrpc(port=port))
            proc = run_block(block.script(sys.executable), folder, env)
        assert proc.returncode in block.exit_codes, (
            f"{block.where}: exit {proc.returncode}, not {' or '.join(map(str, block.exit_codes))}:\n"
            f"{block.body}\n{proc.stdout}")
    return folder


# Pages whose commands hold a run to a latency objective of a few milliseconds on the demo
# SUT: under pytest -n they run while no other test does (tests/conftest.py).
ALONE_PAGES = {"llm.md"}
# Blocks that compare two runs' p99 to 10%, by a line of theirs: each makes the files it
# reads, so it runs in a test of its own, alone, and the rest of its page beside other tests
# (a whole page alone would keep the other workers idle for all of it).
ALONE_BLOCKS = {"results.md": "loadgen compare base new"}


def pages_with_commands() -> List[Path]:
    return [page for page in sorted(DOCS.glob("*.md"))
            if any(not b.not_run for b in run_blocks(page))]


def alone_block(page: Path) -> Optional[Callable[[Block], bool]]:
    """Whether a block of ``page`` runs alone (None: the page has no such block)."""
    needle = ALONE_BLOCKS.get(page.name)
    return None if needle is None else (lambda block: needle in block.body)


@pytest.mark.parametrize("page", [pytest.param(page, marks=[pytest.mark.alone] if page.name in ALONE_PAGES else [])
                                  for page in pages_with_commands()], ids=lambda p: p.name)
def test_the_commands_of_the_page_run_as_written(page, tmp_path):
    alone = alone_block(page)
    run_page(page, tmp_path, None if alone is None else (lambda block: not alone(block)))


@pytest.mark.alone
@pytest.mark.parametrize("page", [DOCS / name for name in sorted(ALONE_BLOCKS)], ids=lambda p: p.name)
def test_the_commands_that_time_runs_closely_run_alone_as_written(page, tmp_path):
    alone = alone_block(page)
    assert alone is not None and any(alone(b) for b in run_blocks(page) if not b.not_run), (
        f"{page.name} has no block with {ALONE_BLOCKS[page.name]!r} any more: ALONE_BLOCKS is stale")
    run_page(page, tmp_path, alone)


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
