"""The HdrHistogram interval log: our writer and reader, and interop with the
``hdrhistogram`` package's log writer and reader and with Java-style logs."""

from __future__ import annotations

import io

import numpy as np
import pytest

from loadgen import (
    Histogram,
    HistogramLogError,
    HistogramLogReader,
    HistogramLogWriter,
    LogEntry,
    read_log,
)
from tests.helpers import HIGHEST, read_hdrh_log

hdrh_histogram = pytest.importorskip("hdrh.histogram")
hdrh_log = pytest.importorskip("hdrh.log")
HdrHistogram = hdrh_histogram.HdrHistogram

BASE = 1_700_000_000.25  # exactly representable with 3 decimals
PERCENTILES = [50.0, 90.0, 99.0, 99.9, 100.0]


def make_histogram(seed: int, n: int = 500) -> tuple[Histogram, list]:
    rng = np.random.default_rng(seed)
    values = rng.lognormal(mean=14, sigma=1.5, size=n).astype(np.int64)
    values = np.clip(values, 1, HIGHEST).tolist()
    h = Histogram(highest_trackable_value=HIGHEST)
    for v in values:
        h.record(v)
    return h, values


def hdrh_from(values) -> HdrHistogram:
    o = HdrHistogram(1, HIGHEST, 3)
    for v in values:
        o.record_value(v)
    return o


# (start_s, interval_s, tag, max_value_unit_ratio)
INTERVALS = [
    (0.0, 1.0, None, 1e6),
    (1.0, 1.5, "svc", 1e6),
    (2.5, 0.25, "other.tag-2", 1e3),
    (2.75, 1.2345, None, 1.0),
]


def write_sample_log(stream, base=BASE, header=True):
    writer = HistogramLogWriter(stream)
    if header:
        writer.write_header(base)
    writer.write_comment("a free comment, with commas")
    histograms = []
    for i, (start, length, tag, ratio) in enumerate(INTERVALS):
        h, values = make_histogram(i)
        histograms.append((h, values))
        writer.write_interval(h, start_s=start, interval_s=length, tag=tag, max_value_unit_ratio=ratio)
    return histograms


# --------------------------------------------------------- our writer, our reader


def test_our_log_reads_back_tags_times_max_column_and_histograms():
    buf = io.StringIO()
    histograms = write_sample_log(buf)
    entries = read_log(io.StringIO(buf.getvalue()))
    assert len(entries) == len(INTERVALS)
    for entry, (start, length, tag, ratio), (h, _) in zip(entries, INTERVALS, histograms):
        assert isinstance(entry, LogEntry)
        assert entry.tag == tag
        assert entry.start_s == float(f"{start:.3f}")
        assert entry.interval_s == float(f"{length:.3f}")
        assert entry.max_value == float(f"{h.max / ratio:.3f}")
        assert entry.histogram == h
        assert entry.histogram.max == h.max
        assert entry.absolute_start_s == pytest.approx(BASE + start, abs=1e-6)
    # 4 header lines + 1 comment, then one line per interval
    assert [e.line_number for e in entries] == [6, 7, 8, 9]


def test_interval_line_format_is_three_decimals_and_tag_prefix():
    buf = io.StringIO()
    h, _ = make_histogram(9)
    w = HistogramLogWriter(buf)
    w.write_interval(h, start_s=1.23456, interval_s=2, tag="abc", max_value_unit_ratio=1e6)
    line = buf.getvalue()
    assert line.endswith("\n") and line.count("\n") == 1
    fields = line.rstrip("\n").split(",")
    assert fields[0] == "Tag=abc"
    assert fields[1:4] == ["1.235", "2.000", f"{h.max / 1e6:.3f}"]
    assert Histogram.decode(fields[4]) == h


def test_header_lines_are_version_start_base_and_legend():
    buf = io.StringIO()
    w = HistogramLogWriter(buf)
    w.write_header(BASE)
    lines = buf.getvalue().splitlines()
    assert lines[0] == "#[Histogram log format version 1.3]"
    assert lines[1].startswith("#[StartTime: 1700000000.250 (seconds since epoch), 2023-11-14")
    assert lines[2] == "#[BaseTime: 1700000000.250 (seconds since epoch)]"
    assert lines[3] == '"StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"'
    assert w.base_time_s == BASE


def test_reader_reports_start_and_base_time_from_the_header():
    buf = io.StringIO()
    write_sample_log(buf)
    reader = HistogramLogReader(io.StringIO(buf.getvalue()))
    entries = list(reader)
    assert reader.start_time_s == BASE
    assert reader.base_time_s == BASE
    assert entries[1].absolute_start_s == pytest.approx(BASE + 1.0)


def test_reader_without_start_or_base_time_treats_timestamps_as_absolute():
    buf = io.StringIO()
    write_sample_log(buf, header=False)
    reader = HistogramLogReader(io.StringIO(buf.getvalue()))
    entries = list(reader)
    assert reader.start_time_s == 0.0  # the first interval's start
    assert reader.base_time_s == 0.0
    assert [e.absolute_start_s for e in entries] == [e.start_s for e in entries]


def test_reader_without_header_and_epoch_timestamps_keeps_them_absolute():
    h, _ = make_histogram(1)
    buf = io.StringIO()
    w = HistogramLogWriter(buf)
    w.write_interval(h, start_s=BASE, interval_s=1.0)
    w.write_interval(h, start_s=BASE + 1, interval_s=1.0)
    reader = HistogramLogReader(io.StringIO(buf.getvalue()))
    entries = list(reader)
    assert reader.start_time_s == pytest.approx(BASE)
    assert reader.base_time_s == 0.0
    assert entries[1].absolute_start_s == pytest.approx(BASE + 1)


def test_start_time_without_base_time_makes_small_timestamps_relative_to_it():
    h, _ = make_histogram(2)
    text = (
        f"#[StartTime: {BASE:.3f} (seconds since epoch), whenever]\n"
        f"0.500,1.000,1.000,{h.encode()}\n"
        f"1.500,1.000,1.000,{h.encode()}\n"
    )
    reader = HistogramLogReader(io.StringIO(text))
    entries = list(reader)
    assert reader.base_time_s == BASE
    assert [e.absolute_start_s for e in entries] == pytest.approx([BASE + 0.5, BASE + 1.5])


def test_start_time_without_base_time_keeps_epoch_timestamps_absolute():
    h, _ = make_histogram(3)
    text = (
        f"#[StartTime: {BASE:.3f} (seconds since epoch), whenever]\n"
        f"{BASE + 2:.3f},1.000,1.000,{h.encode()}\n"
    )
    reader = HistogramLogReader(io.StringIO(text))
    (entry,) = list(reader)
    assert reader.base_time_s == 0.0
    assert entry.absolute_start_s == pytest.approx(BASE + 2)


def test_base_time_without_start_time_offsets_every_interval():
    h, _ = make_histogram(4)
    text = f"#[BaseTime: 1000.000 (seconds since epoch)]\n3.000,1.000,1.000,{h.encode()}\n"
    (entry,) = read_log(io.StringIO(text))
    assert entry.absolute_start_s == 1003.0
    assert entry.start_s == 3.0


def test_reader_reads_from_a_path_a_pathlike_and_a_stream(tmp_path):
    path = tmp_path / "run.hlog"
    with open(path, "w", encoding="utf-8") as f:
        histograms = write_sample_log(f)
    expected = [h for h, _ in histograms]
    assert [e.histogram for e in read_log(str(path))] == expected
    assert [e.histogram for e in read_log(path)] == expected
    with open(path, encoding="utf-8") as f:
        assert [e.histogram for e in read_log(f)] == expected
        assert not f.closed  # a stream passed in is not ours to close
    assert [e.histogram for e in read_log(path.read_text())] == expected  # log text itself


def test_reader_opened_from_a_path_closes_its_file(tmp_path):
    path = tmp_path / "run.hlog"
    path.write_text("")
    with HistogramLogReader(path) as reader:
        assert list(reader) == []
        stream = reader._stream
    assert stream.closed


# ------------------------------------------------------------ hdrh interop




def test_hdrh_reader_reads_every_interval_of_our_log(tmp_path):
    path = tmp_path / "ours.hlog"
    with open(path, "w", encoding="utf-8") as f:
        histograms = write_sample_log(f)
    theirs = read_hdrh_log(path)
    assert len(theirs) == len(INTERVALS)
    for got, (h, values), (start, _, tag, _) in zip(theirs, histograms, INTERVALS):
        oracle = hdrh_from(values)
        assert got.get_total_count() == h.total_count == oracle.get_total_count()
        assert got.get_max_value() == h.max
        assert got.get_min_value() == h.min
        for p in PERCENTILES:
            assert got.get_value_at_percentile(p) == h.value_at_percentile(p)
            assert got.get_value_at_percentile(p) == oracle.get_value_at_percentile(p)
        assert got.get_tag() == tag
        assert got.get_start_time_stamp() == pytest.approx((BASE + start) * 1000.0, abs=1.0)


def test_our_reader_reads_a_log_written_by_hdrh(tmp_path):
    path = tmp_path / "hdrh.hlog"
    base_ms = 1_600_000_000_000
    sources = []
    with open(path, "w", encoding="utf-8") as f:
        w = hdrh_log.HistogramLogWriter(f)
        w.output_log_format_version()
        w.output_comment("written by hdrh")
        w.output_base_time(base_ms)
        w.output_legend()
        for i in range(4):
            _, values = make_histogram(10 + i)
            o = hdrh_from(values)
            sources.append((o, values))
            w.output_interval_histogram(
                o, start_time_stamp_sec=0.5 + i, end_time_stamp_sec=1.5 + i, max_value_unit_ratio=1e6
            )
    entries = read_log(path)
    assert len(entries) == 4
    for i, (entry, (o, values)) in enumerate(zip(entries, sources)):
        ours = Histogram(highest_trackable_value=HIGHEST)
        for v in values:
            ours.record(v)
        assert entry.histogram == ours
        assert entry.histogram.total_count == o.get_total_count()
        assert entry.histogram.max == o.get_max_value()
        for p in PERCENTILES:
            assert entry.histogram.value_at_percentile(p) == o.get_value_at_percentile(p)
        assert entry.tag is None
        assert entry.start_s == 0.5 + i
        assert entry.interval_s == 1.0
        assert entry.max_value == float(o.get_max_value() // 1e6)  # hdrh floors the max
        assert entry.absolute_start_s == pytest.approx(base_ms / 1000 + 0.5 + i)


def test_java_style_log_with_date_string_and_tags_is_read():
    sources = [hdrh_from(make_histogram(20 + i)[1]) for i in range(3)]
    payloads = [o.encode().decode("ascii") for o in sources]
    text = (
        "#[Logged with jHiccup version 2.0.10]\n"
        "#[Histogram log format version 1.3]\n"
        "#[StartTime: 1441812279.474 (seconds since epoch), Wed Sep 09 08:24:39 PDT 2015]\n"
        '"StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"\n'
        f"0.127,1.007,2.769,{payloads[0]}\n"
        f"Tag=A,1.134,0.999,0.442,{payloads[1]}\r\n"
        f"2.133,1.001,0.426,{payloads[2]}\n"
    )
    reader = HistogramLogReader(io.StringIO(text))
    entries = list(reader)
    assert reader.start_time_s == 1441812279.474
    assert reader.base_time_s == 1441812279.474  # relative timestamps, Java style
    assert [e.tag for e in entries] == [None, "A", None]
    assert [e.start_s for e in entries] == [0.127, 1.134, 2.133]
    assert [e.interval_s for e in entries] == [1.007, 0.999, 1.001]
    assert [e.max_value for e in entries] == [2.769, 0.442, 0.426]
    assert [e.line_number for e in entries] == [5, 6, 7]
    assert entries[1].absolute_start_s == pytest.approx(1441812279.474 + 1.134)
    for entry, o in zip(entries, sources):
        assert entry.histogram.total_count == o.get_total_count()
        assert entry.histogram.max == o.get_max_value()
        assert entry.histogram.min == o.get_min_value()
        for p in PERCENTILES:
            assert entry.histogram.value_at_percentile(p) == o.get_value_at_percentile(p)


# ----------------------------------------------------------------- malformed


def good_line() -> str:
    h, _ = make_histogram(30, n=20)
    return f"0.000,1.000,1.000,{h.encode()}"


@pytest.mark.parametrize(
    "bad,reason",
    [
        ("0.000,1.000,HISTFAAAAA==", "expected 4"),
        ("0.000,1.000,1.000,{payload},extra", "expected 4"),
        ("abc,1.000,1.000,{payload}", "numbers"),
        ("0.000,one,1.000,{payload}", "numbers"),
        ("0.000,1.000,1.000,@@notbase64@@", "bad histogram payload"),
        ("0.000,1.000,1.000,QUJDREVGR0g=", "bad histogram payload"),
        ("0.000,1.000,1.000,", "bad histogram payload"),
        ("Tag=A", "Tag="),
        ("Tag=,0.000,1.000,1.000,{payload}", "Tag="),
        ("Tag=A,0.000,1.000,1.000", "expected 4"),
    ],
)
def test_corrupt_interval_line_raises_log_error_naming_its_line(bad, reason):
    h, _ = make_histogram(31, n=20)
    bad = bad.format(payload=h.encode())
    text = "#[Histogram log format version 1.3]\n\n#comment\n" + good_line() + "\n" + bad + "\n"
    with pytest.raises(HistogramLogError, match=f"line 5: .*{reason}") as info:
        read_log(io.StringIO(text))
    assert isinstance(info.value, ValueError)


def test_reader_yields_good_intervals_before_the_bad_line():
    text = good_line() + "\n" + "garbage\n"
    it = iter(HistogramLogReader(io.StringIO(text)))
    first = next(it)
    assert first.line_number == 1 and first.histogram.total_count == 20
    with pytest.raises(HistogramLogError, match="line 2"):
        next(it)


def test_bad_start_time_comment_raises_log_error():
    text = "#[StartTime: 1.2.3 (seconds since epoch)]\n" + good_line() + "\n"
    with pytest.raises(HistogramLogError, match="line 1"):
        read_log(io.StringIO(text))


def test_comments_blank_lines_and_legend_are_skipped():
    h, _ = make_histogram(32, n=10)
    text = (
        "\n"
        "# just a comment\n"
        "   \n"
        '"StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"\n'
        "#[Some other bracketed thing: 5]\n"
        f"  1.000,2.000,3.000,{h.encode()}  \n"
        "\n"
        "#trailing comment, with, commas\n"
    )
    entries = read_log(io.StringIO(text))
    assert len(entries) == 1
    assert entries[0].line_number == 6
    assert entries[0].histogram == h
    assert (entries[0].start_s, entries[0].interval_s, entries[0].max_value) == (1.0, 2.0, 3.0)


def test_empty_log_has_no_intervals():
    assert read_log(io.StringIO("")) == []


@pytest.mark.parametrize("tag", ["a,b", "a b", "a\tb", "", " lead", "a\nb", "x\r"])
def test_writer_rejects_tags_with_commas_or_white_space(tag):
    buf = io.StringIO()
    h, _ = make_histogram(33, n=5)
    with pytest.raises(ValueError, match="tag"):
        HistogramLogWriter(buf).write_interval(h, start_s=0.0, interval_s=1.0, tag=tag)
    assert buf.getvalue() == ""


def test_writer_rejects_a_tag_ending_in_a_newline():
    buf = io.StringIO()
    h, _ = make_histogram(33, n=5)
    with pytest.raises(ValueError, match="tag"):
        HistogramLogWriter(buf).write_interval(h, start_s=0.0, interval_s=1.0, tag="x\n")
    assert buf.getvalue() == ""


def test_every_tag_the_writer_accepts_reads_back_unchanged():
    for tag in ["a", "svc.v2", "A-b_c", "Tag=x", "\u00e9t\u00e9", "x" * 200]:
        buf = io.StringIO()
        h, _ = make_histogram(36, n=5)
        HistogramLogWriter(buf).write_interval(h, start_s=0.0, interval_s=1.0, tag=tag)
        (entry,) = read_log(io.StringIO(buf.getvalue()))
        assert entry.tag == tag
        assert entry.histogram == h


@pytest.mark.parametrize(
    "start,length",
    [(-1.0, 1.0), (0.0, -0.5), (float("nan"), 1.0), (float("inf"), 1.0), (0.0, float("inf"))],
)
def test_writer_rejects_negative_or_non_finite_times(start, length):
    buf = io.StringIO()
    h, _ = make_histogram(34, n=5)
    with pytest.raises(ValueError):
        HistogramLogWriter(buf).write_interval(h, start_s=start, interval_s=length)
    assert buf.getvalue() == ""


@pytest.mark.parametrize("ratio", [0.0, -1.0, float("nan")])
def test_writer_rejects_non_positive_unit_ratio(ratio):
    buf = io.StringIO()
    h, _ = make_histogram(35, n=5)
    with pytest.raises(ValueError, match="ratio"):
        HistogramLogWriter(buf).write_interval(h, start_s=0.0, interval_s=1.0, max_value_unit_ratio=ratio)
    assert buf.getvalue() == ""


@pytest.mark.parametrize("text", ["two\nlines", "carriage\rreturn", "end\n"])
def test_writer_rejects_multi_line_comments(text):
    buf = io.StringIO()
    with pytest.raises(ValueError, match="one line"):
        HistogramLogWriter(buf).write_comment(text)
    assert buf.getvalue() == ""


def test_writer_comment_is_one_hash_prefixed_line_the_reader_skips():
    buf = io.StringIO()
    w = HistogramLogWriter(buf)
    w.write_comment("hello, world")
    assert buf.getvalue() == "#hello, world\n"
    assert read_log(io.StringIO(buf.getvalue())) == []
