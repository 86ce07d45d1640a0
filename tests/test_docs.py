"""The documentation: the site builds with ``mkdocs build --strict`` (links, anchors and the
API reference's docstrings checked), the README's tour runs as written, and every relative
link of README.md and docs/*.md leads somewhere.

The tour's ```bash blocks run one after another in one temporary folder (later ones read
what earlier ones wrote), with ``tests/`` of the source tree beside them for the scripted
server; each runs in a session of its own, bounded in time, and whatever it left running is
stopped by that session's id. A block in docs/*.md is run too when the line before it is
``<!-- run by tests/test_docs.py -->``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from tests.helpers import clean_env

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
RUN_MARK = "<!-- run by tests/test_docs.py -->"
REPO_URL = re.compile(r"^https://github\.com/loadgen-project/loadgen/(?:blob|tree)/main/([^#?]+)")
# The generator-overload rule is loadgen judging its own lateness; on a shared 2-core test
# host that says INVALID for reasons of the host, so the tour's runs get the tests' margin.
TOUR_ENV = {"LOADGEN_MAX_ISSUE_DELAY_MS": "100"}


# ------------------------------------------------------------------------ markdown

def fenced_blocks(text: str) -> List[Tuple[str, str, str]]:
    """(language, body, the line before the fence) of every fenced block, in order."""
    blocks, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*$", lines[i])
        if m is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        blocks.append((m.group(1), "\n".join(lines[i + 1:end]) + "\n", before.strip()))
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

def run_block(body: str, cwd: Path, env: Dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs ``body`` with ``bash -e`` from ``cwd`` in a session of its own; whatever of that
    session is still running when it ends (a server it started) is stopped."""
    proc = subprocess.Popen(["bash", "-e", "-c", body], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"timed out after {timeout} s:\n{body}\n{out}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def readme_bash_blocks() -> List[str]:
    return [body for lang, body, _ in fenced_blocks(README.read_text(encoding="utf-8")) if lang == "bash"]


@pytest.fixture
def workdir(tmp_path):
    """A folder with the source tree's tests/ (the scripted server) beside the commands."""
    (tmp_path / "tests").symlink_to(ROOT / "tests", target_is_directory=True)
    return tmp_path


def test_the_readme_starts_with_the_two_set_up_commands():
    first = readme_bash_blocks()[0]
    assert README.read_text(encoding="utf-8").startswith("# loadgen\n\n```bash\n" + first)
    assert first == "pip install -e . && python -m loadgen run\npip install '.[test]' && pytest\n"


def test_the_first_set_up_command_runs_the_demo_benchmark(workdir):
    # `pip install -e .` is what made this tree importable; its second half runs as written.
    proc = run_block("python -m loadgen run", workdir, clean_env(**TOUR_ENV), timeout=180)
    assert proc.returncode in (0, 1), proc.stdout  # 1: INVALID, a verdict like VALID
    assert re.search(r"^(VALID|INVALID)  server on demo: ", proc.stdout, flags=re.MULTILINE), proc.stdout


def test_the_readme_tour_runs_as_written(workdir):
    tour = readme_bash_blocks()[1:]
    assert len(tour) >= 4, "the tour: a run, a network target, a sweep, a report"
    env = clean_env(**TOUR_ENV)
    for body in tour:
        proc = run_block(body, workdir, env)
        assert proc.returncode == 0, f"{body}\n{proc.stdout}"
    for path in ("runs/first/result.json", "runs/first/report.html", "runs/kserve/result.json",
                 "runs/llm/result.json", "runs/sweep/sweep.jsonl", "runs/sweep.html", "runs/servers.html"):
        assert (workdir / path).is_file(), f"the tour wrote no {path}"
    text = README.read_text(encoding="utf-8")
    for needle in ("loadgen.load_sweep", "loadgen report", "--html", "--sut http", "openai+http"):
        assert needle in "".join(tour), f"the tour lost its {needle} command"
    assert "python -m loadgen run --sut demo" in text


def marked_doc_blocks() -> List[Tuple[str, str]]:
    return [(page.name, body) for page in sorted(DOCS.glob("*.md"))
            for lang, body, before in fenced_blocks(page.read_text(encoding="utf-8"))
            if lang == "bash" and before == RUN_MARK]


def test_the_marked_commands_of_the_docs_run(workdir):
    blocks = marked_doc_blocks()
    assert blocks, f"no block in docs/*.md is marked {RUN_MARK}"
    for page, body in blocks:
        proc = run_block(body, workdir, clean_env(**TOUR_ENV), timeout=120)
        assert proc.returncode == 0, f"{page}:\n{body}\n{proc.stdout}"
