"""loadgen.results.document: the result document, and what a SUT adds to it through the
explicit ReportingSUT interface (named histograms with their units, and its report)."""

import time

import pytest

import loadgen
from loadgen.options import RunOptions
from loadgen.results import build_document, render_summary
from loadgen.runner import run_benchmark
from loadgen.scenarios import get_scenario
from loadgen.sut import NamedHistogram, ReportingSUT


class _Reporting:
    """A SUT that records its own histograms: a queue wait in ns and a rate kept x1000."""

    def __init__(self):
        self.wait = loadgen.Histogram()
        self.rate = loadgen.Histogram()
        self.empty = loadgen.Histogram()
        for v in (1000, 2000, 3000):
            self.wait.record(v)
        self.rate.record(12_500)  # 12.5 per s

    def __call__(self, sample):
        return None

    def histograms(self):
        return {
            "queue_wait_ns": NamedHistogram(self.wait, "ns"),
            "items_per_s": NamedHistogram(self.rate, "items/s", scale=1000.0, recorded_unit="milli-items/s"),
            "nothing_ns": NamedHistogram(self.empty, "ns"),
            "latency_ns": NamedHistogram(self.wait, "ns"),  # the engine's key: not replaced
        }

    def report(self):
        return {"protocol": "test", "note": "side of the run"}


def _document(sut):
    scenario = get_scenario("constant")
    o = scenario.effective(RunOptions(sut="null", query_count=20, target_qps=2000))
    result = loadgen.run(scenario.engine_settings(o), loadgen.NullSUT())
    return build_document(scenario, o, result, interrupted=False, given={}, started_wall=time.time(), sut=sut)


def test_a_sut_histogram_is_in_the_document_under_its_name_and_listed_with_its_unit():
    doc = _document(_Reporting())
    assert doc["queue_wait_ns"]["count"] == 3
    assert doc["queue_wait_ns"]["max"] == pytest.approx(3000, rel=1e-3)
    assert "hdr_unit" not in doc["queue_wait_ns"]
    assert doc["histograms"]["queue_wait_ns"] == {"unit": "ns", "source": "sut"}


def test_a_scaled_sut_histogram_shows_figures_in_its_unit_and_says_what_the_hdr_holds():
    doc = _document(_Reporting())
    rate = doc["items_per_s"]
    assert rate["count"] == 1 and rate["p50"] == pytest.approx(12.5, rel=1e-3)
    assert rate["hdr_unit"] == "milli-items/s"
    assert loadgen.Histogram.decode(rate["hdr"]).max == pytest.approx(12_500, rel=1e-3)
    assert doc["histograms"]["items_per_s"] == {"unit": "items/s", "source": "sut", "scale": 1000.0,
                                                "hdr_unit": "milli-items/s"}


def test_empty_sut_histograms_and_keys_the_document_has_are_left_out():
    doc = _document(_Reporting())
    assert "nothing_ns" not in doc and "nothing_ns" not in doc["histograms"]
    assert doc["latency_ns"]["count"] == 20  # the engine's, not the SUT's 3 values
    assert doc["histograms"]["latency_ns"] == {"unit": "ns", "source": "engine"}


def test_the_engine_histograms_are_indexed_and_a_plain_sut_adds_nothing():
    doc = _document(loadgen.NullSUT())
    assert not isinstance(loadgen.NullSUT(), ReportingSUT)
    assert set(doc["histograms"]) == {"latency_ns", "service_time_ns", "issue_delay_ns"}
    assert all(entry["unit"] == "ns" for entry in doc["histograms"].values())
    assert "network" not in doc


def test_the_sut_report_is_the_network_section_and_its_ns_histograms_are_in_the_summary():
    doc = _document(_Reporting())
    assert doc["network"] == {"protocol": "test", "note": "side of the run"}
    summary = render_summary({k: v for k, v in doc.items() if k != "network"})
    assert "queue wait   p50 2.0 us" in summary


def test_a_scaled_histogram_needs_its_recorded_unit():
    with pytest.raises(ValueError, match="recorded_unit"):
        NamedHistogram(loadgen.Histogram(), "items/s", scale=1000.0)
    with pytest.raises(ValueError, match="scale"):
        NamedHistogram(loadgen.Histogram(), "ns", scale=0)


def test_run_benchmark_hands_the_sut_to_the_document(tmp_path):
    src = tmp_path / "reporting_sut.py"
    src.write_text(
        "import loadgen\n"
        "from loadgen.sut import NamedHistogram\n"
        "class SUT:\n"
        "    def __init__(self):\n"
        "        self.h = loadgen.Histogram()\n"
        "    def issue(self, batch):\n"
        "        self.h.record(len(batch.ids))\n"
        "        batch.complete()\n"
        "    def histograms(self):\n"
        "        return {'batch_size_queries': NamedHistogram(self.h, 'queries')}\n"
        "    def report(self):\n"
        "        return {}\n"
    )
    doc = run_benchmark(RunOptions(scenario="constant", sut=f"python:{src}:SUT", query_count=30,
                                   target_qps=3000, quiet=True))
    assert doc["counts"]["completed"] == 30
    assert doc["batch_size_queries"]["count"] >= 1
    assert doc["histograms"]["batch_size_queries"] == {"unit": "queries", "source": "sut"}
    assert "network" not in doc  # an empty report adds no section
