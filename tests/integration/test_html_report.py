"""The HTML report (report.html): written by run, sweep and merge (and `report --html`),
self-contained, escaped, and drawn by a real headless Chromium with the network cut off.

One Chromium session (module fixture) opens every page: a plain demo run, a run with
scripted GPUs and a SUT whose failures carry HTML, that run's result with a server-metrics
section whose series names carry HTML, a sweep, a merged result, two runs overlaid, a
streamed-token run against the scripted OpenAI server, and three runs overlaid.
For each it checks that the page said it was ready, logged no error, asked for nothing
over the network, has its sections, and that every chart drew data (coloured pixels in
each chart's rectangle of a screenshot). The charts' rules are checked on the data Bokeh
drew, read from the page's models: the partial last interval has no point, a run has only
the charts of figures it has, an interval without a value is a gap, and a run has one
colour in every chart of an overlay.
"""

from __future__ import annotations

import functools
import io
import json
import os
import time
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest

from loadgen.results.files import load_result
from loadgen.results.html import HTML_FILE, render_html, render_sweep_html, script_json
from loadgen.results.html_data import PALETTE, drawn_intervals, error_charts, metric_charts, time_charts
from tests.servers.procs import require_servers
from tests.servers.scripted_proc import start_scripted
from tests.helpers import clean_env, run_cli, write

pytestmark = pytest.mark.integration

# Runs the payload if it is ever parsed as HTML: it sets a global and the page title.
PAYLOAD = ("<script>window.__pwned=1;document.title='pwned'</script></script>"
           "<img src=x onerror=\"window.__pwned=2\"><!--")
RUN_SECTIONS = ["verdict", "headline", "timeline", "spectrum", "errors", "gpu", "host", "server-metrics", "settings"]
SWEEP_SECTIONS = ["verdict", "sweep", "spectrum", "settings"]

FAILING_SUT = """
import time

class Refused(Exception):
    pass

calls = [0]

def f(sample_index):
    calls[0] += 1
    if calls[0] % 7 == 0:
        raise Refused({payload!r})
    time.sleep(0.0005)
"""


# --------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def browser():
    from tests.servers.chromium import Browser, find_chromium

    binary = find_chromium()
    if binary is None:
        message = "chromium is not installed (tests/servers/install_chromium.sh installs it)"
        if require_servers():
            pytest.fail(message)
        pytest.skip(message)
    with Browser(binary) as b:
        yield b


def _gpu_run(folder: Path, sut: str) -> Dict[str, Any]:
    """A run in this process through the runner with two scripted GPUs (FakeBackend, the
    telemetry's test backend), saved like `loadgen run --output` saves it."""
    import loadgen.telemetry.run as telemetry_run
    from loadgen.cli.common import save
    from loadgen.options import resolve
    from loadgen.runner import prepare, run_benchmark
    from loadgen.telemetry import FakeBackend, FakeDevice, GpuSampler

    devices = [FakeDevice("GPU-aaaa", name="Fake H100", utilization_pct=(20.0, 60.0, 90.0), power_w=350.0,
                          memory_used=(10 * 2 ** 30, 12 * 2 ** 30)),
               FakeDevice("GPU-bbbb", name="Fake H100", utilization_pct=(70.0,), power_w=250.0,
                          memory_used=(30 * 2 ** 30,))]
    flags = {"scenario": "poisson", "target_qps": "400", "duration_s": "1.5", "interval_s": "0.25",
             "sut": f"python:{sut}:f", "max_error_rate": "1", "label": [f"note={PAYLOAD}"], "output": str(folder)}
    options, given = resolve(flags, environ={})
    original = telemetry_run.GpuSampler
    telemetry_run.GpuSampler = functools.partial(GpuSampler, backend=FakeBackend(devices))  # type: ignore
    try:
        doc = run_benchmark(options, given=given, prepared=prepare(options))
    finally:
        telemetry_run.GpuSampler = original  # type: ignore
    paths, failure = save(doc, str(folder), partial=False)
    assert failure is None and str(folder / HTML_FILE) in paths
    return doc


def _with_server_metrics(doc: Dict[str, Any]) -> Dict[str, Any]:
    """``doc`` with a server_metrics section whose series names carry the payload."""
    evil = f'requests_total{{model="{PAYLOAD}"}}'
    gauge = f'queue_depth{{model="{PAYLOAD}"}}'
    out = json.loads(json.dumps(doc))
    out["server_metrics"] = {
        "url": "http://127.0.0.1:9/metrics", "scrapes": 4, "failed_scrapes": 0,
        "deltas": {evil: 30.0, "tokens_total": 900.0},
        "gauges": {gauge: {"first": 1, "last": 3, "min": 0, "max": 5, "mean": 2.5, "samples": 4}},
        "intervals": [{"t_s": 0.5 * (i + 1), "deltas": {evil: 10.0, "tokens_total": 300.0},
                       "gauges": {gauge: float(i)}} for i in range(3)],
        "series": 2, "dropped_series": 0, "non_finite_values": 0,
    }
    return out


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """name -> report.html path, each made the way users make it."""
    tmp = tmp_path_factory.mktemp("html")
    env = clean_env()
    out: Dict[str, Path] = {}

    def cli(*args: Any) -> None:
        proc = run_cli(*args, env=env, cwd=tmp, timeout=120)
        assert proc.returncode in (0, 1), proc.stderr

    cli("run", "--duration-s", "1", "--interval-s", "0.25", "--output", "plain", "--quiet")
    out["plain"] = tmp / "plain" / HTML_FILE
    sut = write(tmp / "failing.py", FAILING_SUT.format(payload=PAYLOAD))
    _gpu_run(tmp / "gpu", str(sut))
    out["gpu"] = tmp / "gpu" / HTML_FILE
    metrics = tmp / "metrics"
    metrics.mkdir()
    (metrics / "result.json").write_text(json.dumps(_with_server_metrics(load_result(tmp / "gpu" / "result.json"))))
    cli("report", "--html", "metrics/report.html", "metrics")
    out["metrics"] = metrics / HTML_FILE
    cli("sweep", "--duration-s", "0.5", "--vary", "target-qps=300,600", "--vary", "label.cfg=a,b",
        "--output", "sweep", "--quiet")
    out["sweep"] = tmp / "sweep" / HTML_FILE
    for i in range(2):
        cli("run", "--duration-s", "0.5", "--workers", "2", "--worker-index", str(i), "--output", f"w{i}", "--quiet")
    cli("merge", "w0", "w1", "--output", "merged")
    out["merged"] = tmp / "merged" / HTML_FILE
    cli("report", "--html", "overlay.html", "plain", "gpu")
    out["overlay"] = tmp / "overlay.html"
    # Streams whose first token comes 400 ms after the request: the first 0.25 s interval
    # has neither a first token nor a completion, whatever the load on the host.
    with start_scripted(tmp, "--ttft-ms", "400", "--itl-ms", "20", "--tokens", "5") as srv:
        cli("run", "--scenario", "poisson", "--target-qps", "12", "--seed", "7", "--sut",
            f"openai+{srv.url}/v1/completions", "--model", "m", "--duration-s", "2", "--interval-s", "0.25",
            "--max-error-rate", "1", "--output", "llm", "--quiet")
    out["llm"] = tmp / "llm" / HTML_FILE
    cli("report", "--html", "overlay3.html", "plain", "gpu", "llm")
    out["overlay3"] = tmp / "overlay3.html"
    for name, path in out.items():
        assert path.is_file(), f"{name}: no {path}"
    return out


# --------------------------------------------------------------------------- checks

_RECTS = ("[...document.querySelectorAll('.plot')].map(e => { const r = e.getBoundingClientRect(); "
          "return [e.id, r.left + scrollX, r.top + scrollY, r.width, r.height]; })")


def _series_pixels(image: Any, rect: List[float], colors: List[str]) -> int:
    """Pixels in ``rect`` (less the toolbar on the right) of the colours of the chart's
    series: its lines, bars and markers (axes, grid and text are grey, bounds dark red)."""
    _, left, top, width, height = rect
    box = (int(left), int(top), int(left + width - 40), int(top + height))
    pixels = np.asarray(image.crop(box), dtype=np.int16)
    hit = np.zeros(pixels.shape[:2], dtype=bool)
    for color in set(colors):
        rgb = np.array([int(color[i:i + 2], 16) for i in (1, 3, 5)], dtype=np.int16)
        hit |= (np.abs(pixels - rgb) <= 30).all(axis=2)
    return int(np.count_nonzero(hit))


def check_page(browser, path: Path, sections: List[str], charts: List[str], width: int = 1280) -> Dict[str, Any]:
    """Opens ``path`` offline and checks it: ready, no errors, no network, the sections
    and charts named, every chart drawn. Returns the screenshot's measurements."""
    load = browser.open(path.as_uri(), ready="document.body && document.body.dataset.ready")
    assert browser.evaluate("document.body.dataset.ready") == "1", load.errors
    assert load.errors == []
    assert load.requests == []
    found = browser.evaluate("[...document.querySelectorAll('section')].map(s => s.id)")
    assert [s for s in sections if s not in found] == [], found
    png, rects = _assert_drawn(browser, width)
    ids = [r[0] for r in rects]
    assert [c for c in charts if c not in ids] == [], ids
    return {"png": png, "rects": rects, "ready_s": load.ready_s}


def _assert_drawn(browser, width: int) -> Any:
    """Takes a screenshot ``width`` wide and checks that every chart fits the page and
    drew its data; returns the PNG and the charts' rectangles."""
    from PIL import Image

    # Legends show each series' colour too, and bounds are lines: hidden for the screenshot, so that
    # only the data counts.
    browser.evaluate("Bokeh.documents.forEach(d => d.all_models.forEach(m => { "
                     "if (['Legend', 'Span', 'Label'].includes(m.type)) m.visible = false; }))")
    png, rects = browser.screenshot(_RECTS, width=width)
    assert rects
    specs = {s["id"]: s for s in json.loads(browser.evaluate("document.getElementById('loadgen-charts').textContent"))}
    image = Image.open(io.BytesIO(png)).convert("RGB")
    for rect in rects:
        assert rect[3] > 200 and rect[4] > 150, rect
        assert rect[1] + rect[3] <= width + 1, f"{rect[0]} is wider than the page: {rect}"
        colors = [s["color"] for s in specs[rect[0]]["series"]]
        assert _series_pixels(image, rect, colors) > 200, f"{rect[0]} drew no data: {rect}"
    return png, rects


def test_run_writes_a_report_that_draws_every_section(browser, pages):
    got = check_page(browser, pages["plain"], RUN_SECTIONS,
                     ["chart-latency", "chart-rate", "chart-spectrum-0", "chart-spectrum-1", "chart-spectrum-2",
                      "chart-host"])
    text = browser.evaluate("document.body.innerText")
    assert "VALID" in text and "Headline figures" in text
    assert "no errors" in text and "no GPU sampled" in text and "not scraped" in text
    print(f"plain run: ready in {got['ready_s']:.2f} s, {pages['plain'].stat().st_size / 1e6:.2f} MB")


def test_gpus_and_errors_are_drawn_and_outside_strings_never_run(browser, pages):
    check_page(browser, pages["gpu"], RUN_SECTIONS,
               ["chart-latency", "chart-rate", "chart-errors", "chart-gpu-utilization_pct", "chart-gpu-power_w",
                "chart-gpu-memory_used_bytes", "chart-host"])
    assert browser.evaluate("window.__pwned === undefined && document.title.indexOf('pwned') < 0")
    assert browser.evaluate("document.querySelectorAll('img').length") == 0
    text = browser.evaluate("document.body.innerText")
    assert "Refused" in text
    assert PAYLOAD[:40] in text  # the error message and the label, shown as text
    assert "Fake H100" in text


def test_server_metrics_with_html_in_their_names_are_shown_as_text(browser, pages):
    check_page(browser, pages["metrics"], RUN_SECTIONS, ["chart-metrics-gauges", "chart-metrics-rates"])
    assert browser.evaluate("window.__pwned === undefined && document.title.indexOf('pwned') < 0")
    assert browser.evaluate("document.querySelectorAll('img, section script').length") == 0
    cells = browser.evaluate("[...document.querySelectorAll('#server-metrics td')].map(td => td.textContent)")
    assert f'requests_total{{model="{PAYLOAD}"}}' in cells
    assert f'queue_depth{{model="{PAYLOAD}"}}' in cells


def test_sweep_report_draws_the_curve_per_label(browser, pages):
    check_page(browser, pages["sweep"], SWEEP_SECTIONS, ["chart-sweep", "chart-spectrum-0"])
    specs = json.loads(browser.evaluate("document.getElementById('loadgen-charts').textContent"))
    curve = next(s for s in specs if s["id"] == "chart-sweep")
    names = sorted(s["name"] for s in curve["series"])
    assert names == sorted(f"cfg={c} {p}" for c in "ab" for p in ("p50", "p90", "p99"))
    assert all(len(s["x"]) == 2 and s["x"] == sorted(s["x"]) for s in curve["series"])


def test_merged_and_overlaid_results_render_like_runs(browser, pages):
    check_page(browser, pages["merged"], RUN_SECTIONS, ["chart-latency", "chart-spectrum-0"])
    assert "Merged from 2 workers" in browser.evaluate("document.body.innerText")
    check_page(browser, pages["overlay"], RUN_SECTIONS, ["chart-latency", "chart-spectrum-0", "chart-errors"])
    specs = json.loads(browser.evaluate("document.getElementById('loadgen-charts').textContent"))
    spectrum = next(s for s in specs if s["id"] == "chart-spectrum-0")
    assert [s["name"] for s in spectrum["series"]] == ["plain", "gpu"]


def test_print_layout_fits_the_page_and_keeps_the_charts(browser, pages):
    browser.open(pages["plain"].as_uri(), ready="document.body && document.body.dataset.ready")
    browser.emulate_print(True)
    try:
        _assert_drawn(browser, 720)
        assert browser.evaluate("getComputedStyle(document.querySelector('nav')).display") == "none"
    finally:
        browser.emulate_print(False)
    assert browser.print_pdf()[:4] == b"%PDF"


# --------------------------------------------------------------------------- no browser

def test_script_json_cannot_end_its_script_element():
    text = script_json({"a": "</script><!-- \u2028 \u2029 & >", "n": float("nan")})
    for bad in ("<", ">", "&", "\u2028", "\u2029"):
        assert bad not in text
    assert json.loads(text) == {"a": "</script><!-- \u2028 \u2029 & >", "n": None}


def test_an_hour_of_one_second_intervals_stays_small_and_fast(pages):
    doc = load_result(pages["gpu"].parent / "result.json")
    points = doc["timeseries"]
    hour = []
    for i in range(3600):
        p = dict(points[i % len(points)])
        p.update(t_s=float(i), length_s=1.0)
        hour.append(p)
    doc["timeseries"] = hour
    doc["host"]["intervals"] = [dict(doc["host"]["intervals"][0], t_s=float(i), length_s=1.0) for i in range(3600)]
    start = time.perf_counter()
    text = render_html([("hour", doc)])
    took = time.perf_counter() - start
    print(f"1-hour run: {len(text) / 1e6:.2f} MB in {took:.2f} s")
    assert len(text.encode()) < 5_000_000
    assert took < 5.0
    start = time.perf_counter()
    render_html([("plain", load_result(pages["plain"].parent / "result.json"))])
    assert time.perf_counter() - start < 0.5


def test_no_html_from_flag_environment_and_config(tmp_path):
    env = clean_env()
    run_cli("run", "--duration-s", "0.3", "--output", "a", "--quiet", "--no-html", env=env, cwd=tmp_path)
    run_cli("run", "--duration-s", "0.3", "--output", "b", "--quiet", env=clean_env(LOADGEN_NO_HTML="1"),
            cwd=tmp_path)
    (tmp_path / "c.toml").write_text("no-html = true\n")
    run_cli("run", "--duration-s", "0.3", "--output", "c", "--quiet", "--config", "c.toml", env=env, cwd=tmp_path)
    for name in "abc":
        assert (tmp_path / name / "result.json").is_file()
        assert not (tmp_path / name / HTML_FILE).exists(), name
    from loadgen.cli import main

    assert main(["merge", str(tmp_path / "a"), "--output", str(tmp_path / "m"), "--no-html", "--json"]) in (0, 1)
    assert (tmp_path / "m" / "result.json").is_file() and not (tmp_path / "m" / HTML_FILE).exists()


def test_report_html_usage_errors(pages, tmp_path, monkeypatch, capsys):
    from loadgen.cli import main

    monkeypatch.chdir(tmp_path)
    r = str(pages["plain"].parent)
    (tmp_path / "empty").mkdir()
    cases = [(["--html", r, r], "is a folder"), (["--html", "nowhere/x.html", r], "does not exist"),
             (["--html", "x.html", "--json", r], "exclude each other"), (["--html", "x.html", "empty"], "no result"),
             (["--html", "x.html", str(pages["sweep"].parent), r], "not both")]
    for args, words in cases:
        assert main(["report", *args]) == 2, args
        assert words in capsys.readouterr().err, args
    assert not (tmp_path / "x.html").exists()


def test_render_refuses_nothing_to_show():
    with pytest.raises(ValueError):
        render_html([])
    with pytest.raises(ValueError):
        render_sweep_html([])


def test_report_json_is_escaped_for_any_label(pages):
    text = pages["gpu"].read_text(encoding="utf-8")
    charts = text[text.index('id="loadgen-charts">'):]
    charts = charts[:charts.index("</script>")]
    assert "<" not in charts[len('id="loadgen-charts">'):]
    assert os.path.getsize(pages["gpu"]) < 3_000_000


def _summary(values_ns: List[int]) -> Dict[str, Any]:
    from loadgen.results.document import histogram_summary
    from loadgen.stats.histogram import Histogram

    h = Histogram()
    for v in values_ns:
        h.record(v)
    return histogram_summary(h)


def test_token_histograms_get_spectra_in_ms_and_rates_do_not(pages):
    from loadgen.results.html_data import spectrum_charts

    doc = load_result(pages["plain"].parent / "result.json")
    doc["ttft_ns"] = _summary([20_000_000 + 1000 * i for i in range(1000)])  # 20 to 21 ms
    doc["itl_ns"] = _summary([5_000_000] * 500)
    doc["itl_per_token_ns"] = _summary([1_000_000] * 500)
    doc["ttfat_ns"] = _summary([60_000_000] * 500)
    doc["output_tokens_per_s"] = _summary([40_000] * 10)  # milli-tokens/s: not a time
    doc["histograms"].update({"ttft_ns": {"unit": "ns", "source": "engine"}, "itl_ns": {"unit": "ns", "source": "sut"},
                              "itl_per_token_ns": {"unit": "ns", "source": "sut"},
                              "ttfat_ns": {"unit": "ns", "source": "sut"},
                              "output_tokens_per_s": {"unit": "tokens/s", "source": "sut", "scale": 1000.0,
                                                      "hdr_unit": "milli-tokens/s"}})
    charts = {c["title"]: c for c in spectrum_charts([("a", doc), ("b", doc)])}
    assert list(charts) == ["latency by percentile", "service time by percentile", "issue delay by percentile",
                            "TTFT by percentile", "time to first answer token by percentile",
                            "ITL between chunks by percentile", "ITL per token by percentile"]
    ttft = charts["TTFT by percentile"]["series"]
    assert [s["name"] for s in ttft] == ["a", "b"]
    assert ttft[0]["x"][0] == 2.0 and ttft[0]["x"][-1] <= 1000  # from p50, as far as 1000 values go
    assert 20.4 <= ttft[0]["y"][0] <= 20.6 and ttft[0]["y"][-1] <= 21.05
    assert all(abs(y - 5.0) <= 0.005 for y in charts["ITL between chunks by percentile"]["series"][0]["y"])  # HDR precision
    assert all(abs(y - 1.0) <= 0.001 for y in charts["ITL per token by percentile"]["series"][0]["y"])


def test_newer_interval_keys_are_drawn_when_present(pages):
    doc = load_result(pages["plain"].parent / "result.json")
    for i, p in enumerate(doc["timeseries"]):
        p.update(p90_ns=3_000_000, failed=i, timed_out=1, errors={"Refused": i, PAYLOAD: 1}, outstanding=4 + i,
                 issue_delay_p50_ns=1000, issue_delay_p99_ns=50_000, issue_delay_max_ns=90_000,
                 ttft_p50_ns=10_000_000, ttft_p99_ns=30_000_000, tokens=100)
    ids = [c["id"] for c in time_charts([("a", doc)])]
    assert ids == ["chart-latency", "chart-rate", "chart-issue-delay", "chart-ttft", "chart-outstanding"]
    latency = time_charts([("a", doc)])[0]
    assert next(s for s in latency["series"] if s["name"] == "p90")["y"][0] == 3.0
    [errors] = error_charts([("a", doc)])
    assert errors["title"] == "Errors by class per interval"
    assert [s["name"] for s in errors["series"]] == ["Refused", PAYLOAD, "timed_out"]
    drawn = drawn_intervals(doc["timeseries"])  # the run's last, partial interval is left out
    assert errors["series"][0]["y"] == [i for i, p in enumerate(doc["timeseries"]) if p in drawn]
    page = render_html([("a", doc)])
    assert PAYLOAD not in page and "<script>window.__pwned" not in page


def test_token_stream_figures_and_goodput_are_headline_figures(pages):
    from loadgen.results.html_sections import _headline, _headline_rows

    doc = load_result(pages["plain"].parent / "result.json")
    assert not {"TTFT", "goodput", "prompt tokens"} & {k for k, _ in _headline_rows(doc)}  # none without them
    doc["ttft_ns"] = {"count": 3, "p50": 20_500_000, "p90": 20_900_000, "p99": 21_000_000, "max": 21_000_000}
    doc["throughput"].update(output_tokens_per_s=1234.5, output_tokens_per_s_per_stream=61.25)
    doc["goodput"] = {"slos": ["ttft<=25000000ns"], "requests_per_s": 9.5, "met": 19, "of": 20, "fraction": 0.95,
                      "per_slo": {"ttft": {"bound_ns": 25_000_000, "met": 19, "fraction": 0.95}}}
    doc["llm"] = {"input_tokens_exact": False,
                  "prompts": {"input_tokens": {"count": 8, "mean": 512.0, "p50": 510, "p90": 600, "max": 700}},
                  "requests": {"output_tokens": {"count": 20, "mean": 64.0, "p50": 64, "p90": 64, "max": 64}}}
    rows = dict(_headline_rows(doc))
    assert rows["TTFT"] == "p50 20.5 ms, p90 20.9 ms, p99 21 ms, max 21 ms"
    assert rows["output tokens/s"] == "1234 in all, 61.25 per stream"
    assert rows["goodput"] == "9.5 requests/s met every SLO: 19 of 20 (ttft 95%)"
    assert rows["prompt tokens"] == "mean 512, p50 510, p90 600, max 700 (approximate)"
    assert rows["output tokens"] == "mean 64, p50 64, p90 64, max 64"  # counted from usage: not approximate
    assert "19 of 20 (ttft 95%)" in _headline([("a", doc)])
    # Multi-turn: the input tokens each request carried and the conversations' fates.
    doc["input_length_tokens"] = {"count": 20, "p50": 300, "p99": 900, "max": 950}
    doc["llm"]["conversations"] = {"started": 9, "finished": 6, "cut_short": {"run_ended": 3, "failed_turn": 0},
                                   "turns_completed": [9, 7, 6]}
    rows = dict(_headline_rows(doc))
    assert rows["input tokens sent"] == "p50 300, p99 900, max 950 per request"
    assert rows["conversations"] == ("9 started, 6 finished, 3 cut by the run's end, 0 by a failed turn; "
                                     "turns completed 9/7/6")
    # An embeddings run's throughput: the input tokens sent per second.
    assert "input tokens/s" not in rows
    doc["throughput"]["input_tokens_per_s"] = 2048.25
    assert dict(_headline_rows(doc))["input tokens/s"] == "2048 sent"


# --------------------------------------------------------------------------- the charts' rules

# What Bokeh drew, from the page's models: chart id -> its glyphs (name, kind, colour, dash, x, y; NaN as null).
_DRAWN = ("Object.fromEntries(Bokeh.documents[0].roots().map(p => [p.name, p.renderers"
          ".filter(r => r.type === 'GlyphRenderer').map(r => ({name: r.name, glyph: r.glyph.type, "
          "color: r.glyph.line_color.value, dash: r.glyph.line_dash ? r.glyph.line_dash.value : null, "
          "x: Array.from(r.data_source.data.x, v => Number.isNaN(v) ? null : v), "
          "y: Array.from(r.data_source.data.y, v => Number.isNaN(v) ? null : v)}))]))")


def _drawn(browser, path: Path) -> Dict[str, List[Dict[str, Any]]]:
    browser.open(path.as_uri(), ready="document.body && document.body.dataset.ready")
    assert browser.evaluate("document.body.dataset.ready") == "1"
    return browser.evaluate(_DRAWN)


def _middles(points: List[Dict[str, Any]]) -> List[float]:
    return [round(p["t_s"] + p["length_s"] / 2, 3) for p in points]


def _lines(drawn: Dict[str, List[Dict[str, Any]]], cid: str) -> List[Dict[str, Any]]:
    return [g for g in drawn[cid] if g["glyph"] == "Line"]


def test_the_partial_last_interval_has_no_point_in_any_time_chart(browser, pages):
    doc = load_result(pages["plain"].parent / "result.json")
    points, host = doc["timeseries"], doc["host"]["intervals"]
    # The run's end cuts its last interval short: milliseconds of draining after the last full one.
    assert points[-1]["length_s"] < max(p["length_s"] for p in points) / 2, points[-1]
    drawn = _drawn(browser, pages["plain"])
    time_ids = [s["id"] for s in json.loads(browser.evaluate("document.getElementById('loadgen-charts').textContent"))
                if s.get("group") == "time"]
    assert {"chart-latency", "chart-rate", "chart-issue-delay", "chart-outstanding", "chart-host"} <= set(time_ids)
    for cid in time_ids:
        intervals = host if cid == "chart-host" else points
        full = [p for p in intervals if p["length_s"] >= max(q["length_s"] for q in intervals) / 2]
        for line in drawn[cid]:
            assert line["x"] == _middles(full), (cid, line["name"])
            assert _middles(intervals[-1:])[0] not in line["x"] or intervals[-1] in full, (cid, line["name"])
    # The rate chart: one point per full interval, each the interval's own rate (no spike at the end).
    completed = next(g for g in _lines(drawn, "chart-rate") if g["name"] == "completed")
    assert completed["y"] == pytest.approx([p["completed"] / p["length_s"] for p in points[:-1]], rel=1e-3)
    text = browser.evaluate("document.getElementById('timeline').innerText")
    assert "shorter than half the run's longest" in text and "left out of every time chart" in text


def test_a_run_has_only_the_charts_of_the_figures_it_has(browser, pages):
    plain = _drawn(browser, pages["plain"])
    assert "chart-latency" in plain and "chart-host" in plain
    absent = [c for c in plain if c == "chart-ttft" or c.startswith(("chart-gpu", "chart-errors", "chart-metrics"))]
    assert absent == []  # a demo run: no first tokens, no GPU, no errors, no scraped metrics
    plots = browser.evaluate("[...document.querySelectorAll('.plot')].map(e => e.id)")
    assert sorted(plots) == sorted(plain)
    check_page(browser, pages["llm"], RUN_SECTIONS,
               ["chart-latency", "chart-rate", "chart-ttft", "chart-outstanding", "chart-spectrum-0"])
    llm = browser.evaluate(_DRAWN)
    assert "chart-ttft" in llm and "chart-errors" not in llm


def test_an_interval_without_a_value_is_a_gap_not_a_zero(browser, pages):
    doc = load_result(pages["llm"].parent / "result.json")
    points = drawn_intervals(doc["timeseries"])
    assert doc["counts"]["tokens"] > 0 and doc["ttft_ns"]["count"] > 0
    drawn = _drawn(browser, pages["llm"])
    rules = {"chart-ttft": lambda p: p["ttft_p50_ns"] > 0, "chart-latency": lambda p: p["completed"] > 0,
             "chart-issue-delay": lambda p: p["issued"] > 0}
    for cid, has_value in rules.items():
        for line in _lines(drawn, cid):
            assert line["x"] == _middles(points)
            assert [y is not None for y in line["y"]] == [has_value(p) for p in points], (cid, line["name"])
            assert 0 not in line["y"], (cid, line["name"])
    # The first interval has neither a first token (400 ms after a request) nor a completion (480 ms).
    for cid, least_ms in (("chart-ttft", 399.0), ("chart-latency", 479.0)):
        for line in _lines(drawn, cid):
            assert line["y"][0] is None, (cid, line["name"])
            values = [y for y in line["y"] if y is not None]
            assert len(values) >= 2 and min(values) >= least_ms, (cid, line)


def test_a_value_between_gaps_is_drawn_as_a_dot(browser, pages, tmp_path):
    doc = load_result(pages["plain"].parent / "result.json")
    doc["timeseries"] = [_point(0.0), _point(1.0, ttft_p50_ns=30_000_000, ttft_p99_ns=40_000_000), _point(2.0),
                         _point(3.0, ttft_p50_ns=20_000_000, ttft_p99_ns=25_000_000),
                         _point(4.0, ttft_p50_ns=21_000_000, ttft_p99_ns=26_000_000)]
    page = tmp_path / "gaps.html"
    page.write_text(render_html([("a", doc)]), encoding="utf-8")
    glyphs = {(g["name"], g["glyph"]): g for g in _drawn(browser, page)["chart-ttft"]}
    assert glyphs[("p50", "Line")]["y"] == [None, 30.0, None, 20.0, 21.0]
    assert glyphs[("p50", "Scatter")]["y"] == [None, 30.0, None, None, None]  # alone: a line cannot show it
    assert glyphs[("p99", "Scatter")]["y"] == [None, 40.0, None, None, None]
    assert [g["name"] for g in _drawn(browser, page)["chart-latency"] if g["glyph"] == "Scatter"] == []


def test_a_run_has_one_colour_in_every_chart_of_an_overlay(browser, pages):
    check_page(browser, pages["overlay3"], RUN_SECTIONS,
               ["chart-latency", "chart-rate", "chart-ttft", "chart-errors", "chart-gpu-power_w", "chart-host",
                "chart-spectrum-0"])
    drawn = browser.evaluate(_DRAWN)
    runs = ["plain", "gpu", "llm"]
    charts_of: Dict[str, set] = {r: set() for r in runs}
    for cid, glyphs in drawn.items():
        dashes: Dict[str, List[str]] = {}
        for g in glyphs:
            run = g["name"].split(": ")[0]  # "run: p50", or the run's name alone on a spectrum
            assert run in runs, (cid, g["name"])
            assert g["color"] == PALETTE[runs.index(run)], (cid, g["name"], g["color"])
            charts_of[run].add(cid)
            if g["glyph"] == "Line":
                dashes.setdefault(run, []).append(g["dash"])
        for run, each in dashes.items():  # a run's lines in one chart are told apart by dash
            assert len(set(map(str, each))) == len(each), (cid, run, each)
    assert {"chart-latency", "chart-rate", "chart-host", "chart-spectrum-0"} <= charts_of["plain"] & charts_of["gpu"]
    assert {"chart-gpu-power_w", "chart-errors"} <= charts_of["gpu"] and "chart-ttft" in charts_of["llm"]
    assert not any(c.startswith("chart-gpu") or c in ("chart-ttft", "chart-errors") for c in charts_of["plain"])
    assert [g["name"].split(": ")[0] for g in drawn["chart-ttft"]] == ["llm", "llm"]


def _point(t: float, length: float = 1.0, **figures: Any) -> Dict[str, Any]:
    p = {"t_s": t, "length_s": length, "issued": 100, "completed": 100, "qps": 100 / length, "p50_ns": 2_000_000,
         "p90_ns": 3_000_000, "p99_ns": 4_000_000, "max_ns": 5_000_000, "failed": 0, "timed_out": 0, "errors": {},
         "outstanding": 2, "issue_delay_p50_ns": 1000, "issue_delay_p99_ns": 2000, "issue_delay_max_ns": 3000,
         "ttft_p50_ns": 0, "ttft_p99_ns": 0, "tokens": 0}
    p.update(figures)
    return p


def test_chart_data_rules_on_made_up_intervals():
    # Full intervals, one where nothing completed or was issued, one with first tokens, and
    # the 4 ms one the run's end cuts, which would be a spike of 25,000 queries/s.
    points = [_point(0.0), _point(1.0, completed=0, issued=0, qps=0.0, p50_ns=0, p90_ns=0, p99_ns=0, max_ns=0,
                                  issue_delay_p50_ns=0, issue_delay_p99_ns=0, issue_delay_max_ns=0),
              _point(2.0, ttft_p50_ns=30_000_000, ttft_p99_ns=40_000_000, tokens=50), _point(3.0),
              _point(4.0, length=0.004, completed=100, qps=25_000.0, ttft_p50_ns=9_000_000)]
    assert drawn_intervals(points) == points[:4]
    charts = {c["id"]: c for c in time_charts([("a", {"timeseries": points})])}
    assert list(charts) == ["chart-latency", "chart-rate", "chart-issue-delay", "chart-ttft", "chart-outstanding"]
    for c in charts.values():
        assert all(s["x"] == [0.5, 1.5, 2.5, 3.5] for s in c["series"]), c["id"]
    assert [s["y"] for s in charts["chart-latency"]["series"]][0] == [2.0, None, 2.0, 2.0]
    assert [s["y"] for s in charts["chart-rate"]["series"]] == [[100.0, 0.0, 100.0, 100.0], [100.0, 0.0, 100.0, 100.0]]
    assert charts["chart-issue-delay"]["series"][0]["y"] == [0.001, None, 0.001, 0.001]
    assert [s["y"] for s in charts["chart-ttft"]["series"]] == [[None, None, 30.0, None], [None, None, 40.0, None]]
    # Without first tokens (or with them only in the cut interval) there is no TTFT chart.
    points[2].update(ttft_p50_ns=0, ttft_p99_ns=0)
    assert "chart-ttft" not in {c["id"] for c in time_charts([("a", {"timeseries": points})])}
    assert error_charts([("a", {"timeseries": points})]) == []
    # Several runs: each run's colour in every chart, its lines told apart by dash.
    errors = [dict(p, failed=1, errors={"Refused": 1}) for p in points]
    runs = [("a", {"timeseries": points}), ("b", {"timeseries": errors, "errors": {"counts": {"Refused": 5}}})]
    for c in time_charts(runs) + error_charts(runs):
        for s in c["series"]:
            assert s["color"] == PALETTE["ab".index(s["name"][0])], (c["id"], s["name"])
    latency = time_charts(runs)[0]["series"]
    assert [s["dash"] for s in latency] == ["solid", "dashed", "solid", "dashed"]
    rates = time_charts(runs)[1]["series"]  # issued dashed, completed solid, alone or overlaid
    assert [s["dash"] for s in rates] == ["dashed", "solid", "dashed", "solid"]
    assert [s["dash"] for s in time_charts(runs[:1])[1]["series"]] == ["dashed", "solid"]


def test_error_bars_and_server_rates_follow_the_same_rules():
    runs = [("a", {"errors": {"counts": {}}}), ("b", {"errors": {"counts": {"Refused": 3}}, "counts": {"timed_out": 2}})]
    [bars] = error_charts(runs)
    assert bars["kind"] == "bar" and [(s["name"], s["x"], s["color"]) for s in bars["series"]] == [
        ("b", ["b: Refused", "b: timed_out"], PALETTE[1])]
    # Scrapes 1 s apart and a last one 0.1 s after (the run's end): its rate is left out.
    scrapes = [{"t_s": t, "deltas": {"requests_total": 10.0}, "gauges": {"queue": 1.0}} for t in (1.0, 2.0, 3.0, 3.1)]
    charts = {c["id"]: c for c in metric_charts([("a", {"server_metrics": {"intervals": scrapes}})])}
    [rate] = charts["chart-metrics-rates"]["series"]
    assert rate["x"] == [1.0, 2.0, 3.0] and rate["y"] == [10.0, 10.0, 10.0]
    assert charts["chart-metrics-gauges"]["series"][0]["x"] == [1.0, 2.0, 3.0, 3.1]
