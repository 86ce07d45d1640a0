"""HDR latency histograms: the native histogram with a Pythonic face.

A :class:`Histogram` records non-negative integers (nanoseconds, by convention) with a
fixed relative precision over a huge range, merges exactly with others, and encodes to
the standard HdrHistogram V2 form that every HdrHistogram implementation reads.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Dict, Iterable, Iterator, NamedTuple, Sequence, Tuple, Union

from loadgen import _core

if TYPE_CHECKING:  # numpy is imported where arrays are made or read
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "DEFAULT_HIGHEST_TRACKABLE_VALUE",
    "DEFAULT_PERCENTILES",
    "HdrDecodeError",
    "Histogram",
    "RecordedBuckets",
]

#: One hour in nanoseconds: the default top of the range for latencies in ns.
DEFAULT_HIGHEST_TRACKABLE_VALUE = 3_600_000_000_000

#: The percentiles that summaries report.
DEFAULT_PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9, 99.99)

#: Raised for a malformed encoded histogram (a ValueError).
HdrDecodeError = _core.HdrDecodeError

_COMPRESSED_COOKIE_PREFIX = b"\x1c\x84\x93"
_INT64_MAX = 2**63 - 1


class RecordedBuckets(NamedTuple):
    """The non-empty buckets of a histogram, in ascending value order.

    Attributes:
        lowest_values: the lowest value that falls into each bucket.
        highest_values: the highest value that falls into each bucket (the value
            HdrHistogram's own iterators report).
        counts: how many values were recorded in each bucket.
    """

    lowest_values: np.ndarray
    highest_values: np.ndarray
    counts: np.ndarray


class Histogram:
    """A High Dynamic Range histogram of non-negative 64-bit integers.

    Values are kept to ``significant_figures`` decimal digits of precision at every
    magnitude between ``lowest_discernible_value`` and ``highest_trackable_value``.
    Recording is native: :meth:`record_array` costs a couple of nanoseconds a value and
    releases the GIL. All methods are safe to call from several threads at once; reads
    may overlap recording.

    Args:
        lowest_discernible_value: smallest value told apart from 0 (>= 1).
        highest_trackable_value: largest value to record (>= 2 * lowest).
        significant_figures: decimal digits of precision, 1..5.

    Raises:
        ValueError: a setting is out of range; the message names it.
    """

    __slots__ = ("_h",)

    def __init__(
        self,
        *,
        lowest_discernible_value: int = 1,
        highest_trackable_value: int = DEFAULT_HIGHEST_TRACKABLE_VALUE,
        significant_figures: int = 3,
    ) -> None:
        for name, value in (
            ("lowest_discernible_value", lowest_discernible_value),
            ("highest_trackable_value", highest_trackable_value),
            ("significant_figures", significant_figures),
        ):
            if not _is_integer(value):
                raise TypeError(f"{name} must be an integer, got {value!r}")
            if not -_INT64_MAX <= value <= _INT64_MAX:
                raise ValueError(f"{name} must be at most {_INT64_MAX}, got {value}")
        self._h = _core.HdrHistogram(
            int(lowest_discernible_value), int(highest_trackable_value), int(significant_figures)
        )

    @classmethod
    def from_core(cls, core: _core.HdrHistogram) -> Histogram:
        """A Histogram around a native ``_core.HdrHistogram`` (no copy): how the engine
        and the MLPerf runtime hand out what the core recorded."""
        obj = cls.__new__(cls)
        obj._h = core
        return obj


    # ----------------------------------------------------------------- recording

    def record(self, value: int) -> bool:
        """Records one value.

        Returns:
            False when the value is negative or beyond the range; it is then counted in
            :attr:`rejected_count` instead.
        """
        return self._h.record(value)

    def record_n(self, value: int, count: int) -> bool:
        """Records ``count`` occurrences of ``value`` (see :meth:`record`)."""
        return self._h.record_n(value, count)

    def record_corrected(self, value: int, expected_interval: int, count: int = 1) -> bool:
        """Records a value and back-fills the samples coordinated omission hid.

        When ``value`` exceeds ``expected_interval`` (> 0), also records
        ``value - k * expected_interval`` for every k >= 1 while that is at least
        ``expected_interval``, exactly as HdrHistogram_c's ``hdr_record_corrected_values``.

        Returns:
            False if any of the values was out of range.
        """
        return self._h.record_corrected(value, expected_interval, count)

    def record_array(self, values: Union[np.ndarray, Sequence[int]],
                     counts: Union[None, np.ndarray, Sequence[int]] = None) -> int:
        """Records every value of an integer array, natively and without the GIL.

        Args:
            values: integers of any shape (flattened); int64 is used as is, other
                integer types are converted.
            counts: optional array of the same length: how many times to record each value.

        Returns:
            How many values were recorded; the others were out of range and are counted in
            :attr:`rejected_count`.

        Raises:
            TypeError: the values are not integers (cast or round them first).
            ValueError: ``counts`` does not have the same length as ``values``.
        """
        v = _as_int64(values, "values")
        c = None if counts is None else _as_int64(counts, "counts")
        return self._h.record_array(v, c)

    # ------------------------------------------------------------- merge, reset

    def add(self, other: Histogram) -> Histogram:
        """Adds every count of ``other`` into this histogram and returns self.

        Exact when both have the same layout (same significant figures, range and unit);
        otherwise each of other's buckets is added at its lowest equivalent value.

        Raises:
            ValueError: ``other`` holds values beyond this histogram's range (nothing
                is added then).
        """
        if not isinstance(other, Histogram):
            raise TypeError(f"can only add a Histogram, got {type(other).__name__}")
        if not self._h.can_hold(other._h):
            raise ValueError(
                f"cannot add: the other histogram holds values up to {other.max}, beyond this "
                f"histogram's highest_trackable_value {self.highest_trackable_value}"
            )
        self._h.add(other._h)
        return self

    def __iadd__(self, other: Histogram) -> Histogram:
        return self.add(other)

    def __add__(self, other: Histogram) -> Histogram:
        return self.copy().add(other)

    def reset(self) -> None:
        """Clears all counts, min, max and the rejected count."""
        self._h.reset()

    def copy(self) -> Histogram:
        """An independent copy."""
        return Histogram.from_core(self._h.copy())

    __copy__ = copy

    def __deepcopy__(self, memo: Dict[int, Any]) -> Histogram:
        return self.copy()

    # --------------------------------------------------------------- statistics

    @property
    def total_count(self) -> int:
        """Number of values recorded."""
        return self._h.total_count

    @property
    def rejected_count(self) -> int:
        """Number of values offered but not recorded (negative or beyond the range)."""
        return self._h.rejected_count

    @property
    def min(self) -> int:
        """Smallest recorded value, to the histogram's precision (0 when empty)."""
        return self._h.min

    @property
    def max(self) -> int:
        """Largest recorded value, to the histogram's precision (0 when empty)."""
        return self._h.max

    @property
    def exact_min(self) -> int:
        """Smallest value recorded, exactly (kept beside the buckets; 0 when empty)."""
        return self._h.raw_min if self._h.total_count else 0

    @property
    def exact_max(self) -> int:
        """Largest value recorded, exactly (kept beside the buckets; 0 when empty)."""
        return self._h.raw_max if self._h.total_count else 0

    @property
    def mean(self) -> float:
        """Mean of the recorded values (0.0 when empty)."""
        return self._h.mean

    @property
    def stddev(self) -> float:
        """Population standard deviation of the recorded values (0.0 when empty)."""
        return self._h.stddev

    def value_at_percentile(self, percentile: float) -> int:
        """The value at or below which ``percentile`` percent of the values lie.

        Args:
            percentile: 0..100.

        Returns:
            The highest value equivalent to the bucket reached (the lowest for 0); 0 when
            the histogram is empty.
        """
        _check_percentile(percentile)
        return self._h.value_at_percentile(float(percentile))

    def values_at_percentiles(self, percentiles: Iterable[float]) -> np.ndarray:
        """:meth:`value_at_percentile` for many percentiles at once, as an int64 array."""
        import numpy as np

        if not isinstance(percentiles, np.ndarray):
            percentiles = list(percentiles)
        ps = np.ascontiguousarray(percentiles, dtype=np.float64).ravel()
        if ps.size and (np.isnan(ps).any() or ps.min() < 0.0 or ps.max() > 100.0):
            raise ValueError("percentiles must all be within 0..100")
        return self._h.values_at_percentiles(ps)

    def percentiles(self, percentiles: Iterable[float] = DEFAULT_PERCENTILES) -> Dict[float, int]:
        """A dict from each percentile to its value (one :meth:`value_at_percentile`
        each: no numpy, which a run's report does not otherwise need)."""
        ps = [float(p) for p in percentiles]
        for p in ps:
            _check_percentile(p)
        return {p: self._h.value_at_percentile(p) for p in ps}

    def percentile_of_value(self, value: int) -> float:
        """Percentage of recorded values at or below ``value`` (to bucket precision)."""
        return self._h.percentile_of_value(value)

    def count_between(self, low: int, high: int) -> int:
        """Number of recorded values between ``low`` and ``high`` (bucket precision)."""
        return self._h.count_between(low, high)

    def count_at_value(self, value: int) -> int:
        """Number of recorded values equivalent to ``value``."""
        return self._h.count_at_value(value)

    # -------------------------------------------------------------- layout, data

    @property
    def lowest_discernible_value(self) -> int:
        return self._h.lowest_discernible_value

    @property
    def highest_trackable_value(self) -> int:
        return self._h.highest_trackable_value

    @property
    def significant_figures(self) -> int:
        return self._h.significant_figures

    @property
    def counts_len(self) -> int:
        """Length of the counts array."""
        return self._h.counts_len

    @property
    def bucket_count(self) -> int:
        return self._h.bucket_count

    @property
    def sub_bucket_count(self) -> int:
        return self._h.sub_bucket_count

    @property
    def unit_magnitude(self) -> int:
        return self._h.unit_magnitude

    def lowest_equivalent_value(self, value: int) -> int:
        """Smallest value that shares ``value``'s bucket."""
        return self._h.lowest_equivalent_value(value)

    def highest_equivalent_value(self, value: int) -> int:
        """Largest value that shares ``value``'s bucket."""
        return self._h.highest_equivalent_value(value)

    def median_equivalent_value(self, value: int) -> int:
        """Middle of ``value``'s bucket (what mean and stddev use)."""
        return self._h.median_equivalent_value(value)

    def equivalent_value_range(self, value: int) -> int:
        """Width of ``value``'s bucket."""
        return self._h.equivalent_value_range(value)

    def counts(self) -> np.ndarray:
        """A copy of the whole counts array (int64, length :attr:`counts_len`)."""
        return self._h.counts()

    def recorded_buckets(self) -> RecordedBuckets:
        """The non-empty buckets as numpy arrays (see :class:`RecordedBuckets`)."""
        return RecordedBuckets(*self._h.recorded_buckets())

    def __iter__(self) -> Iterator[Tuple[int, int]]:
        """Yields ``(highest_equivalent_value, count)`` for each non-empty bucket."""
        buckets = self.recorded_buckets()
        return zip(buckets.highest_values.tolist(), buckets.counts.tolist())

    # ----------------------------------------------------------------- encoding

    def encode(self) -> str:
        """The base64 text of the V2 compressed form (as in histogram logs)."""
        return self._h.encode_base64()

    def encode_compressed(self, level: int = -1) -> bytes:
        """The V2 compressed form (zlib ``level`` 1..9, or -1 for zlib's default)."""
        if level != -1 and not 0 <= level <= 9:
            raise ValueError(f"level must be -1 or 0..9, got {level}")
        return self._h.encode_compressed(level)

    def encode_uncompressed(self) -> bytes:
        """The V2 uncompressed payload (header and ZigZag LEB128 counts)."""
        return self._h.encode_uncompressed()

    @classmethod
    def decode(cls, data: Union[str, bytes]) -> Histogram:
        """Decodes base64 text (str or bytes) or raw V2 compressed bytes.

        Raises:
            HdrDecodeError: the input is not a valid V2 histogram; the message says why.
        """
        if isinstance(data, (bytes, bytearray, memoryview)):
            raw = bytes(data)
            if raw.startswith(_COMPRESSED_COOKIE_PREFIX):
                return cls.decode_compressed(raw)
            try:
                data = raw.decode("ascii")
            except UnicodeDecodeError:
                raise HdrDecodeError("input is neither base64 text nor a V2 compressed histogram") from None
        if not isinstance(data, str):
            raise TypeError(f"decode() takes str or bytes, got {type(data).__name__}")
        return cls.from_core(_core.HdrHistogram.decode_base64(data))

    @classmethod
    def decode_compressed(cls, data: bytes) -> Histogram:
        """Decodes the V2 compressed form. Raises HdrDecodeError when malformed."""
        return cls.from_core(_core.HdrHistogram.decode_compressed(bytes(data)))

    @classmethod
    def decode_uncompressed(cls, data: bytes) -> Histogram:
        """Decodes a V2 uncompressed payload. Raises HdrDecodeError when malformed."""
        return cls.from_core(_core.HdrHistogram.decode_uncompressed(bytes(data)))

    # ------------------------------------------------------------------ dunders

    def same_layout(self, other: Histogram) -> bool:
        """True when :meth:`add` between the two is an exact array sum."""
        return self._h.same_layout(other._h)

    def __eq__(self, other: object) -> bool:
        import numpy as np

        if not isinstance(other, Histogram):
            return NotImplemented
        return (
            self.lowest_discernible_value == other.lowest_discernible_value
            and self.highest_trackable_value == other.highest_trackable_value
            and self.significant_figures == other.significant_figures
            and self.total_count == other.total_count
            and self.rejected_count == other.rejected_count
            and bool(np.array_equal(self.counts(), other.counts()))
        )

    # Mutable, so unhashable, as the data model allows; typeshed declares object.__hash__
    # as a method and has no way to say None here.
    __hash__: ClassVar[None] = None  # type: ignore[assignment]

    def __reduce__(self) -> Tuple[Callable[[bytes, int, int, int], Histogram], Tuple[bytes, int, int, int]]:
        # The encoding keeps the counts; the raw min and max ride along so that min and
        # max come back exactly as they were.
        return (_unpickle, (self.encode_compressed(), self.rejected_count, self._h.raw_min, self._h.raw_max))

    def __repr__(self) -> str:
        if not self.total_count:
            return (
                f"Histogram(total_count=0, range=[{self.lowest_discernible_value}, "
                f"{self.highest_trackable_value}], significant_figures={self.significant_figures})"
            )
        p50, p99 = self.values_at_percentiles([50.0, 99.0])
        return (
            f"Histogram(total_count={self.total_count}, min={self.min}, p50={p50}, "
            f"p99={p99}, max={self.max}, significant_figures={self.significant_figures})"
        )


def _unpickle(compressed: bytes, rejected_count: int, raw_min: int, raw_max: int) -> Histogram:
    h = Histogram.decode_compressed(compressed)
    h._h.add_rejected(rejected_count)
    if h.total_count:
        h._h.restore_raw_min_max(raw_min, raw_max)
    return h


def _is_integer(value: Any) -> bool:
    """An int or a numpy integer, not a bool (a numpy integer means numpy is loaded)."""
    if isinstance(value, bool):
        return False
    np = sys.modules.get("numpy")
    return isinstance(value, int) or (np is not None and isinstance(value, np.integer))


def _check_percentile(percentile: float) -> None:
    if not 0.0 <= percentile <= 100.0:  # also false for NaN
        raise ValueError(f"percentile must be within 0..100, got {percentile}")


def _as_int64(values: npt.ArrayLike, name: str) -> np.ndarray:
    import numpy as np

    arr = np.asarray(values)
    if arr.dtype.kind == "u":
        if arr.size and arr.max() > _INT64_MAX:
            raise ValueError(f"{name} holds values above the int64 range")
    elif arr.dtype.kind != "i":
        if arr.size == 0:
            arr = arr.astype(np.int64)
        else:
            raise TypeError(
                f"{name} must be integers, got dtype {arr.dtype}: round or cast them first "
                f"(for example np.rint(x).astype(np.int64))"
            )
    return np.ascontiguousarray(arr, dtype=np.int64).ravel()
