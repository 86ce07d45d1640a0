"""The documentation: the site builds with ``mkdocs build --strict`` (links, anchors and the
API reference's docstrings checked), every relative link of README.md and docs/*.md leads
somewhere, and every shell block they show is typed and runs or says why not (the rules:
tests/docs_pages.py; tests/integration/test_docs_commands.py runs them).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from tests.docs_pages import (COMMAND_LIKE, DOCS, EXIT, NOT_RUN, README, ROOT, WITH, console_commands,
                              doc_blocks, not_run_blocks, pages, shell_blocks)

REPO_URL = re.compile(r"^https://github\.com/loadgen-project/loadgen/(?:blob|tree)/main/([^#?]+)")


# ------------------------------------------------------------------------ markdown

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

def test_no_untyped_block_holds_commands():
    bad = [f"{b.where}: {line}" for page in pages() for b in doc_blocks(page) if not b.lang
           for line in b.body.split("\n") if COMMAND_LIKE.match(line)][:20]
    assert not bad, "commands in untyped blocks (make them ```bash, or ```console with '$ ' prompts):\n" + "\n".join(bad)


def test_every_mark_is_one_the_test_reads():
    bad = [f"{b.where}: {b.mark}" for page in pages() for b in doc_blocks(page)
           if b.mark.startswith("<!--") and not (b.runs and any(m.match(b.mark) for m in (NOT_RUN, EXIT, WITH)))]
    assert not bad, "\n".join(bad)


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



def test_the_readme_starts_with_the_two_set_up_commands():
    first = shell_blocks(README)[0]
    assert README.read_text(encoding="utf-8").startswith(f"# loadgen\n\n{first.mark}\n\n```bash\n{first.body}")
    assert first.body == "pip install -e . && python -m loadgen run\npip install '.[test]' && pytest -n 2\n"
    assert shell_blocks(DOCS / "index.md")[0].body == first.body, "the getting-started page starts with them too"




# ------------------------------------------------------------------------ commands in prose

INLINE_COMMAND = re.compile(r"`((?:python -m )?loadgen(?: [^`\n]*)?)`")
# A synopsis rather than a command: a placeholder (FILE, DIR...), an optional [part], a
# choice a|b, or "...".
SYNOPSIS = re.compile(r"\b[A-Z][A-Z_]{2,}\b|\[|\||\.\.\.|<")


def inline_commands() -> List[tuple]:
    """(page:line, command) of every loadgen command in a code span of the pages' prose."""
    found = []
    for page in pages():
        for number, line in enumerate(unfenced(page.read_text(encoding="utf-8")).split("\n"), 1):
            for m in INLINE_COMMAND.finditer(line):
                command = m.group(1).replace("\\|", "|")
                found.append((f"{page.relative_to(ROOT)}:{number}", command.removeprefix("python -m ")))
    return found


def command_parser(name: str):
    from loadgen.cli import _build_parser

    parser, _ = _build_parser(name)
    return parser, next(a for a in parser._actions if a.dest == "command").choices[name]


def check_inline_command(command: str) -> None:
    """Raises AssertionError unless ``command`` (``loadgen ...``) names a command and only
    flags it has; a command without placeholders must also parse with its values, and a
    ``run`` must resolve to valid options (nothing is run)."""
    from loadgen.cli import COMMANDS

    words = command.split()[1:]
    if words[:1] == ["..."]:
        return  # "loadgen ...": any command
    if not words or words[0].startswith("-"):
        assert words in ([], ["--version"], ["--help"]), f"{command}: not a loadgen command"
        return
    name = words[0]
    assert name in COMMANDS, f"{command}: loadgen has no command {name!r}"
    parser, sub = command_parser(name)
    flags = {s for a in sub._actions for s in a.option_strings}
    named = [w.split("=")[0] for w in words if w.startswith("--")]
    unknown = [f for f in named if f not in flags]
    assert not unknown, f"{command}: `loadgen {name}` has no {', '.join(unknown)}"
    last = sub._option_string_actions.get(words[-1]) if words[-1].startswith("--") else None
    if len(words) == 1 or SYNOPSIS.search(command) or (last is not None and last.nargs != 0):
        return  # the command named, a synopsis, or a flag named with no value
    args = parser.parse_args(words)  # UsageError on a bad value
    if name == "run":
        from loadgen.cli.common import check_applies, check_thresholds, run_flags
        from loadgen.options import resolve

        flags_given = run_flags(args)
        options, given = resolve(flags_given, environ={})
        check_thresholds(options)
        check_applies(options, flags_given, given)


@pytest.mark.parametrize("where,command", inline_commands(), ids=[w for w, _ in inline_commands()])
def test_every_loadgen_command_in_the_prose_is_one_loadgen_takes(where, command):
    from loadgen.cli.common import UsageError
    from loadgen.options import OptionError

    try:
        check_inline_command(command)
    except (UsageError, OptionError, ValueError) as e:
        pytest.fail(f"{where}: `{command}`: {e}")


def test_the_prose_check_refuses_a_flag_or_value_loadgen_does_not_take():
    from loadgen.cli.common import UsageError
    from loadgen.options import OptionError

    for bad in ("loadgen run --no-such-flag", "loadgen sweep --vary NAME=VALUES --bogus", "loadgen frobnicate",
                "loadgen run --scenario no-such-scenario", "loadgen run --target-qps many"):
        with pytest.raises((AssertionError, UsageError, OptionError, ValueError)):
            check_inline_command(bad)
    check_inline_command("loadgen run --scenario poisson --target-qps 2000")
    check_inline_command("loadgen merge DIR... --output DIR")
    check_inline_command("loadgen run --output")


def test_ci_runs_the_readme_test_command():
    # The README's second set-up line is the suite as CI runs it: .ci/run has both of its
    # commands, each on a line of its own, in that order.
    install, tests = shell_blocks(README)[0].body.splitlines()[1].split(" && ")
    ci_lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert install in ci_lines and tests in ci_lines, (install, tests)
    assert ci_lines.index(install) < ci_lines.index(tests)
