"""The HTML report (``report.html``): one self-contained page over one or more result
documents, or over sweeps.

The page carries everything it needs inline: its style sheet, BokehJS (read from the
installed ``bokeh`` package's files; Bokeh itself is never imported), the chart specs as
JSON (:mod:`loadgen.results.html_data`) and ``report.js``, which draws them. It opens from
disk with no network. Every string that came from outside (error messages and kinds,
metric names and labels, labels, settings, paths) is escaped in the HTML, and the JSON in
the page escapes ``<``, ``>``, ``&``, U+2028 and U+2029, so that nothing can end its
script element.
"""

from __future__ import annotations

import html
import importlib.util
import json
import os
import re
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from loadgen.results.html_sections import run_sections, sweep_sections
from loadgen.results.html_data import Run

__all__ = ["HTML_FILE", "BokehMissing", "redacted", "render_html", "render_sweep_html", "script_json"]

#: The name of the report in a run's ``--output`` folder.
HTML_FILE = "report.html"
_HERE = os.path.dirname(os.path.abspath(__file__))
_BOKEH_FILES = ("bokeh.min.js", "bokeh-api.min.js")
_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_cache: Dict[str, str] = {}


class BokehMissing(RuntimeError):
    """The ``bokeh`` package (whose BokehJS draws the charts) is not installed."""


def script_json(value: Any) -> str:
    """``value`` as JSON that is safe inside a ``<script>`` element: no ``<``, ``>``,
    ``&``, U+2028 or U+2029 appears as itself, and non-finite numbers are null."""
    text = json.dumps(_finite(value), separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return "".join(_JSON_ESCAPES.get(c, c) for c in text) if any(c in text for c in _JSON_ESCAPES) else text


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _read(path: str) -> str:
    text = _cache.get(path)
    if text is None:
        with open(path, encoding="utf-8") as f:
            text = _cache[path] = f.read()
    return text


def bokeh_js() -> Tuple[str, str]:
    """(BokehJS and its plotting API, minified; the bokeh version), read from the
    installed package without importing it. BokehMissing when it is not installed."""
    spec = importlib.util.find_spec("bokeh")
    if spec is None or not spec.origin:
        raise BokehMissing("the HTML report needs the bokeh package for its charts: pip install bokeh")
    folder = os.path.join(os.path.dirname(spec.origin), "server", "static", "js")
    try:
        script = "\n".join(_read(os.path.join(folder, name)) for name in _BOKEH_FILES)
    except OSError as e:
        raise BokehMissing(f"the bokeh package has no BokehJS ({e.filename}): reinstall bokeh") from None
    return script, _bokeh_version(folder)


def _bokeh_version(folder: str) -> str:
    """BokehJS's version, from its own ``version="X"`` (cheaper than package metadata)."""
    found = re.search(r'\.version="([0-9][^"]{0,30})"', _read(os.path.join(folder, _BOKEH_FILES[0])))
    return found.group(1) if found else "?"


def _page(title: str, subtitle: str, sections: List[Tuple[str, str, str]], specs: List[Dict[str, Any]]) -> str:
    """The whole page: ``sections`` are (id, heading, inner HTML); ``specs`` the charts."""
    script, version = bokeh_js()
    nav = "".join(f'<a href="#{sid}">{html.escape(heading)}</a>' for sid, heading, _ in sections)
    body = "".join(f'<section id="{sid}"><h2>{html.escape(heading)}</h2>{inner}</section>'
                   for sid, heading, inner in sections)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{_read(os.path.join(_HERE, 'report.css'))}</style>"
        f"<script>{script}</script></head>\n<body><header><h1>{html.escape(title)}</h1>"
        f'<p class="sub">{html.escape(subtitle)}</p><nav>{nav}</nav></header><main>{body}</main>'
        f'<footer>Written by loadgen; charts drawn by BokehJS {html.escape(version)}, inlined: this '
        "page needs no network.</footer>\n"
        f'<script type="application/json" id="loadgen-charts">{script_json(specs)}</script>\n'
        f"<script>{_read(os.path.join(_HERE, 'report.js'))}</script></body></html>\n"
    )


class _Settings:
    """A document's recorded options read as run options, for their secrets (the
    request template's file is not read: a report reads only the documents)."""

    def __init__(self, settings: Any) -> None:
        self._settings = settings if isinstance(settings, dict) else {}

    def __getattr__(self, name: str) -> Any:
        return None if name == "request_template" else self._settings.get(name)


def redacted(doc: Dict[str, Any]) -> Dict[str, Any]:
    """``doc`` with the secrets its own recorded options name redacted (credential
    headers, URL passwords, secret query values), and secret query values wherever a URL
    holds one: a report shows none, even of a document written without redaction."""
    from loadgen.net.options import options_redactor

    settings, sweep = doc.get("settings"), doc.get("sweep")
    settings = settings if isinstance(settings, dict) else {}
    sweep = sweep if isinstance(sweep, dict) else {}
    sources = [settings.get("effective"), settings.get("given"), sweep.get("values")]
    out: Dict[str, Any] = options_redactor(*(_Settings(s) for s in sources)).doc(doc)
    return out


def render_html(runs: Sequence[Run], title: Optional[str] = None) -> str:
    """The report of one or more runs (result documents; a merged one renders as a run).
    Several runs are overlaid: their spectra and their time series on one axis.

    Args:
        runs: (name shown for the run, its result document), at least one.
        title: the page's title (default: from the first run).

    Raises:
        BokehMissing: the bokeh package is not installed.
    """
    if not runs:
        raise ValueError("render_html needs at least one result document")
    runs = [(name, redacted(doc)) for name, doc in runs]
    sections, specs = run_sections(runs)
    first = runs[0][1]
    default = f"loadgen: {first.get('scenario', '?')} on {first.get('sut', '?')}" if len(runs) == 1 \
        else f"loadgen: {len(runs)} runs"
    subtitle = ", ".join(name for name, _ in runs)
    return _page(title or default, subtitle, sections, specs)


def render_sweep_html(sweeps: Sequence[Tuple[str, Iterable[Dict[str, Any]]]], title: Optional[str] = None) -> str:
    """The report of one or more sweeps: the throughput/latency curve over the points
    (a line per label set), the points' table and their spectra overlaid.

    Args:
        sweeps: (name of the sweep, its sweep.jsonl records), at least one.
        title: the page's title.

    Raises:
        BokehMissing: the bokeh package is not installed.
    """
    named: List[Tuple[str, List[Dict[str, Any]]]] = [(n, [redacted(x) for x in r]) for n, r in sweeps]
    if not named:
        raise ValueError("render_sweep_html needs at least one sweep")
    sections, specs = sweep_sections(named)
    points = sum(len(r) for _, r in named)
    subtitle = f"{', '.join(n for n, _ in named)}: {points} point run(s)"
    return _page(title or "loadgen: sweep", subtitle, sections, specs)



def write_html(path: str, text: str) -> str:
    """Writes a report atomically (a reader never sees part of one); returns ``path``."""
    from loadgen.results.files import atomic_write

    atomic_write(path, text)
    return path
