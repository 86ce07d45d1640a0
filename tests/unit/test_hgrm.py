"""HdrHistogram's percentile distribution (``.hgrm``): ``loadgen.stats.hgrm``, ``loadgen hlog
--hgrm`` and ``loadgen report --hgrm``, checked against the ``hdrhistogram`` package's own
``output_percentile_distribution`` for the same histogram.

hdrhistogram 0.10 steps its percentile rows by ``2 ** (log2(100 / gap) + 1)`` ticks where
HdrHistogram's Java and C implementations (whose files the plotter was written for) take
the whole number of halvings, ``2 ** (int(log2(100 / gap)) + 1)``: 10%, 20%, ... 50%, 55%.
The comparison runs the package's own iterator and writer with that one step as Java and
C take it; its footer writes the standard deviation unscaled and the count as a float,
so the footer's numbers are compared, not its text.
"""

from __future__ import annotations

import io
import math
import random
import re

import pytest
from hdrh import iterators
from hdrh.histogram import HdrHistogram

from loadgen.cli import main
from loadgen.stats.hdrlog import HistogramLogWriter
from loadgen.stats.hgrm import percentile_distribution, percentile_steps
from loadgen.stats.histogram import Histogram


class _JavaSteps(iterators.PercentileIterator):  # type: ignore[misc]
    """hdrhistogram's percentile iterator with Java's and C's step (whole halvings)."""

    def increment_iteration_level(self) -> None:
        gap = 100.0 - self.percentile_to_iterate_to
        if gap:
            halvings = int(math.log(100 / gap) / math.log(2))
            self.percentile_to_iterate_to += 100.0 / (self.percentile_ticks_per_half_distance * 2 ** (halvings + 1))


def hdrh_text(h: Histogram, ratio: float) -> str:
    theirs = HdrHistogram.decode(h.encode())
    theirs.get_percentile_iterator = lambda ticks: _JavaSteps(theirs, ticks)
    out = io.BytesIO()
    theirs.output_percentile_distribution(out, ratio)
    return out.getvalue().decode()


def footer_numbers(text: str) -> list:
    return [float(x) for line in text.splitlines() if line.startswith("#[")
            for x in re.findall(r"=\s*([0-9.]+)", line)]


def sample(seed: int, n: int) -> Histogram:
    rng = random.Random(seed)
    h = Histogram()
    for _ in range(n):
        h.record(int(rng.lognormvariate(13, 1.2)))
    return h


@pytest.mark.parametrize("seed, n, ratio", [(1, 10_000, 1e6), (2, 37, 1e3), (3, 1, 1.0), (4, 200_000, 1e6)])
def test_rows_match_hdrhistograms_writer(seed, n, ratio):
    h = sample(seed, n)
    ours, theirs = percentile_distribution(h, ratio), hdrh_text(h, ratio)
    assert ours.splitlines()[:-3] == theirs.splitlines()[:-3]
    mean, stddev, top, count, buckets, sub_buckets = footer_numbers(ours)
    t_mean, t_stddev, t_top, t_count, t_buckets, t_sub = footer_numbers(theirs)
    assert (mean, top, count, buckets, sub_buckets) == (t_mean, t_top, t_count, t_buckets, t_sub)
    assert stddev == pytest.approx(t_stddev / ratio, abs=10 ** -h.significant_figures)
    assert ours.splitlines()[-2].startswith("#[Max     = ") and f"Total count    = {n:12d}]" in ours


def test_steps_are_javas_and_end_at_100_percent():
    h = sample(5, 5000)
    levels = [level for _, level, _ in percentile_steps(h)]
    assert levels[:7] == pytest.approx([0, 10, 20, 30, 40, 50, 55])
    assert levels[-1] == 100.0 and levels == sorted(levels)
    assert list(percentile_steps(Histogram())) == []
    with pytest.raises(ValueError, match="scaling ratio"):
        percentile_distribution(h, 0)


def write_log(path, histograms, tags=None):
    with open(path, "w") as f:
        writer = HistogramLogWriter(f)
        writer.write_header(1_700_000_000.0)
        for k, h in enumerate(histograms):
            writer.write_interval(h, start_s=k, interval_s=1.0, tag=tags[k] if tags else None)


def test_hlog_hgrm_writes_the_merged_intervals(tmp_path, capsys):
    parts = [sample(10 + k, 500) for k in range(3)]
    log = tmp_path / "run.hlog"
    write_log(log, parts)
    whole = parts[0].copy()
    for h in parts[1:]:
        whole.add(h)
    assert main(["hlog", str(log), "--hgrm", "-", "--unit", "ms"]) == 0
    assert capsys.readouterr().out == percentile_distribution(whole, 1e6)
    out = tmp_path / "run.hgrm"
    assert main(["hlog", str(log), "--hgrm", str(out)]) == 0
    assert out.read_text() == percentile_distribution(whole, 1e3)  # --unit us by default
    write_log(log, parts, tags=["a", "b", "a"])
    assert main(["hlog", str(log), "--hgrm", "-"]) == 2
    assert "choose one with --tag" in capsys.readouterr().err
    assert main(["hlog", str(log), "--hgrm", "-", "--tag", "b", "--unit", "ns"]) == 0
    assert capsys.readouterr().out == percentile_distribution(parts[1], 1.0)


def test_report_hgrm_writes_a_results_histogram(tmp_path, capsys):
    from loadgen.options import RunOptions
    from loadgen.results import write_outputs
    from loadgen.runner import run_benchmark

    doc = run_benchmark(RunOptions(scenario="constant", sut="demo", target_qps=500.0, duration_s=0.2,
                                   max_issue_delay_ms=100.0))
    write_outputs(doc, str(tmp_path / "r"))
    assert main(["report", str(tmp_path / "r"), "--hgrm", "-", "--unit", "ms"]) == 0
    assert capsys.readouterr().out == percentile_distribution(Histogram.decode(doc["latency_ns"]["hdr"]), 1e6)
    assert main(["report", str(tmp_path / "r"), "--hgrm", "-", "--histogram", "service_time_ns"]) == 0
    assert capsys.readouterr().out == percentile_distribution(Histogram.decode(doc["service_time_ns"]["hdr"]), 1e3)
    assert main(["report", str(tmp_path / "r"), "--hgrm", "-", "--histogram", "nope"]) == 2
    assert "has no histogram 'nope' (it has: latency_ns" in capsys.readouterr().err
