"""The HdrHistogram interval log: a text file of timestamped, encoded histograms.

The format is the one HdrHistogram's own tools (HistogramLogProcessor, HdrHistogram
plotters) and the ``hdrhistogram`` Python package read and write::

    #[Histogram log format version 1.3]
    #[StartTime: 1700000000.000 (seconds since epoch), 2023-11-14T22:13:20+00:00]
    #[BaseTime: 1700000000.000 (seconds since epoch)]
    "StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"
    0.000,1.000,12.345,HISTFAAAA...
    Tag=service,0.000,1.000,3.210,HISTFAAAA...

Interval timestamps are seconds relative to the base time (absolute when the base time
is 0); ``Interval_Max`` is the interval's largest value divided by a unit ratio (1e6 by
default: nanoseconds shown as milliseconds).
"""

from __future__ import annotations

import datetime as _dt
import io
import math
import os
import re
from dataclasses import dataclass
from typing import IO, Iterator, List, Optional, Tuple, Union

from loadgen.files import HLOG_LIMIT_BYTES, open_bounded, size_text
from loadgen.stats.histogram import HdrDecodeError, Histogram
from loadgen.units import NS_PER

__all__ = [
    "HISTOGRAM_LOG_FORMAT_VERSION",
    "MAX_LINE_BYTES",
    "HistogramLogError",
    "HistogramLogReader",
    "HistogramLogWriter",
    "LogEntry",
    "read_log",
]

HISTOGRAM_LOG_FORMAT_VERSION = "1.3"
_LEGEND = '"StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"'
_START_TIME = re.compile(r"#\[StartTime:\s*([-+0-9.eE]+)")
_BASE_TIME = re.compile(r"#\[BaseTime:\s*([-+0-9.eE]+)")
_TAG = re.compile(r"[^,\s]+")
_YEAR_S = 365 * 24 * 3600.0
#: The longest line read: an interval's compressed histogram of the widest range at
#: the finest precision is a few MiB of base64.
MAX_LINE_BYTES = 16 << 20


class HistogramLogError(ValueError):
    """A histogram log line could not be read; the message names the line."""


@dataclass(frozen=True)
class LogEntry:
    """One interval of a histogram log.

    Attributes:
        tag: the interval's tag, or None when untagged.
        start_s: the start timestamp as written (relative to the base time).
        interval_s: the interval length in seconds.
        max_value: the ``Interval_Max`` column as written (max / unit ratio).
        histogram: the decoded interval histogram.
        absolute_start_s: start_s plus the log's base time (seconds since the epoch when
            the log has a start or base time).
        line_number: where the interval was read, 1-based.
    """

    tag: Optional[str]
    start_s: float
    interval_s: float
    max_value: float
    histogram: Histogram
    absolute_start_s: float
    line_number: int


class HistogramLogWriter:
    """Writes a histogram interval log to a text stream.

    Args:
        stream: a text stream open for writing.
    """

    def __init__(self, stream: IO[str]) -> None:
        self._out = stream
        self.base_time_s = 0.0

    def write_comment(self, text: str) -> None:
        """Writes ``#text`` (one line)."""
        if "\n" in text or "\r" in text:
            raise ValueError("a log comment must be one line")
        self._out.write(f"#{text}\n")

    def write_version(self) -> None:
        self.write_comment(f"[Histogram log format version {HISTOGRAM_LOG_FORMAT_VERSION}]")

    def write_start_time(self, epoch_s: float) -> None:
        """Records when the run started, in seconds since the epoch."""
        when = _dt.datetime.fromtimestamp(epoch_s, tz=_dt.timezone.utc).isoformat()
        self.write_comment(f"[StartTime: {epoch_s:.3f} (seconds since epoch), {when}]")

    def write_base_time(self, epoch_s: float) -> None:
        """Makes later interval timestamps relative to ``epoch_s``."""
        self.write_comment(f"[BaseTime: {epoch_s:.3f} (seconds since epoch)]")
        self.base_time_s = float(epoch_s)

    def write_legend(self) -> None:
        self._out.write(_LEGEND + "\n")

    def write_header(self, start_time_s: float) -> None:
        """Version, start time, base time (= start time) and legend, in that order."""
        self.write_version()
        self.write_start_time(start_time_s)
        self.write_base_time(start_time_s)
        self.write_legend()

    def write_interval(
        self,
        histogram: Histogram,
        *,
        start_s: float,
        interval_s: float,
        tag: Optional[str] = None,
        max_value_unit_ratio: float = NS_PER["ms"],
    ) -> None:
        """Writes one interval line.

        Args:
            histogram: the interval's histogram.
            start_s: the interval start, seconds relative to the base time (>= 0).
            interval_s: the interval length in seconds (>= 0).
            tag: optional tag (no commas or white space).
            max_value_unit_ratio: divides the max for the ``Interval_Max`` column.
        """
        if tag is not None and not _TAG.fullmatch(tag):
            raise ValueError(f"tag {tag!r} must be non-empty, without commas or white space")
        if not (start_s >= 0 and interval_s >= 0 and math.isfinite(start_s + interval_s)):
            raise ValueError(f"start_s and interval_s must be finite and >= 0, got {start_s}, {interval_s}")
        if not max_value_unit_ratio > 0:
            raise ValueError(f"max_value_unit_ratio must be > 0, got {max_value_unit_ratio}")
        prefix = f"Tag={tag}," if tag is not None else ""
        self._out.write(
            f"{prefix}{start_s:.3f},{interval_s:.3f},"
            f"{histogram.max / max_value_unit_ratio:.3f},{histogram.encode()}\n"
        )


class HistogramLogReader:
    """Reads the intervals of a histogram log, in file order.

    Args:
        source: a path (read up to :data:`loadgen.files.HLOG_LIMIT_BYTES`), or a text or
            binary stream.

    Iterating yields :class:`LogEntry` objects. A malformed interval line raises
    :class:`HistogramLogError` naming the line; comments and the legend are skipped.
    """

    def __init__(self, source: Union[str, os.PathLike[str], IO[str], IO[bytes]]) -> None:
        # A path is read as bytes and decoded line by line, so that a file that is not
        # text is reported at its line (a text stream decodes ahead, in blocks).
        self._stream: Union[IO[str], IO[bytes]]
        if isinstance(source, (str, os.PathLike)):
            self._stream = open_bounded(source, what="histogram log", limit_bytes=HLOG_LIMIT_BYTES)
            self._owns = True
        else:
            self._stream = source
            self._owns = False
        self.start_time_s: Optional[float] = None
        self.base_time_s: Optional[float] = None

    def __enter__(self) -> HistogramLogReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._owns:
            self._stream.close()

    def __iter__(self) -> Iterator[LogEntry]:
        for number, raw in self._lines():
            line = raw.strip()
            if not line or line.startswith('"StartTimestamp"'):
                continue
            if line.startswith("#"):
                self._read_comment(line, number)
                continue
            yield self._read_interval(line, number)

    def _lines(self) -> Iterator[Tuple[int, str]]:
        """(1-based number, text) of each line; HistogramLogError "not an HdrHistogram
        log" for a line that is not UTF-8 text or holds NUL bytes (a binary file)."""
        number = 0
        while True:
            try:
                raw = self._stream.readline(MAX_LINE_BYTES + 1)
            except UnicodeDecodeError:  # a text stream, decoding ahead of the line
                raise HistogramLogError(f"not an HdrHistogram log: not UTF-8 text (after line {number})") from None
            if not raw:
                return
            number += 1
            if len(raw) > MAX_LINE_BYTES:
                raise HistogramLogError(f"not an HdrHistogram log: line {number} is longer than "
                                        f"{size_text(MAX_LINE_BYTES)}, the most an interval line may be")
            if isinstance(raw, bytes):
                try:
                    raw = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise HistogramLogError(f"not an HdrHistogram log: line {number} is not UTF-8 text") from None
            if "\x00" in raw:
                raise HistogramLogError(f"not an HdrHistogram log: line {number} holds binary data (NUL bytes)")
            yield number, raw

    def _read_comment(self, line: str, number: int) -> None:
        for pattern, attr in ((_START_TIME, "start_time_s"), (_BASE_TIME, "base_time_s")):
            m = pattern.match(line)
            if m:
                try:
                    setattr(self, attr, float(m.group(1)))
                except ValueError:
                    raise HistogramLogError(f"line {number}: bad time in {line[:60]!r}") from None

    def _read_interval(self, line: str, number: int) -> LogEntry:
        tag = None
        if line.startswith("Tag="):
            tag, sep, line = line[4:].partition(",")
            if not sep or not tag:
                raise HistogramLogError(f"line {number}: a Tag= line needs a tag and the interval fields")
        fields = line.split(",")
        if len(fields) != 4:
            raise HistogramLogError(
                f"line {number}: expected 4 comma-separated fields "
                f"(start, length, max, histogram), got {len(fields)}"
            )
        try:
            start_s, interval_s, max_value = (float(f) for f in fields[:3])
        except ValueError:
            raise HistogramLogError(f"line {number}: start, length and max must be numbers") from None
        try:
            histogram = Histogram.decode(fields[3])
        except HdrDecodeError as e:
            raise HistogramLogError(f"line {number}: bad histogram payload: {e}") from None
        if self.start_time_s is None:
            self.start_time_s = start_s
        if self.base_time_s is None:
            # As HdrHistogram's readers do: timestamps far below the start time are
            # relative to it; otherwise they are absolute.
            self.base_time_s = self.start_time_s if start_s < self.start_time_s - _YEAR_S else 0.0
        return LogEntry(
            tag=tag,
            start_s=start_s,
            interval_s=interval_s,
            max_value=max_value,
            histogram=histogram,
            absolute_start_s=start_s + self.base_time_s,
            line_number=number,
        )


def read_log(source: Union[str, os.PathLike[str], IO[str]]) -> List[LogEntry]:
    """All intervals of a log as a list of :class:`LogEntry`."""
    if isinstance(source, str) and "\n" in source:
        source = io.StringIO(source)
    with HistogramLogReader(source) as reader:
        return list(reader)
