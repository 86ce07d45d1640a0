"""The HdrHistogram V2 encodings: round trips, interop with the ``hdrhistogram``
package, payloads built by hand, and malformed input of every kind."""

from __future__ import annotations

import base64
import struct
import time
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadgen import HdrDecodeError, Histogram

hdrh_histogram = pytest.importorskip("hdrh.histogram")
HdrHistogram = hdrh_histogram.HdrHistogram

INT64_MAX = 2**63 - 1
COMPRESSED_COOKIE = 0x1C849314
UNCOMPRESSED_COOKIE = 0x1C849313
V1_COMPRESSED_COOKIE = 0x1C849302
PERCENTILES = [0.0, 1.0, 25.0, 50.0, 75.0, 90.0, 99.0, 99.9, 99.99, 100.0]

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# (lowest_discernible_value, highest_trackable_value, significant_figures)
CONFIGS = [
    (1, 3_600_000_000_000, 3),
    (1, 1000, 1),
    (1000, 10**12, 2),
    (7, 10**15, 4),
    (1, 2**40, 5),
    (1, INT64_MAX, 2),
]


# ------------------------------------------------------------------- helpers
# An encoder written from the format description, independent of the library.


def zigzag_leb128(value: int) -> bytes:
    """ZigZag then LEB128 in HdrHistogram's 9-byte variant (the 9th byte holds 8 bits)."""
    assert -(2**63) <= value <= INT64_MAX
    v = (value << 1) ^ (value >> 63)
    v &= 2**64 - 1
    out = bytearray()
    for _ in range(8):
        if v >> 7 == 0:
            out.append(v)
            return bytes(out)
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)  # ninth byte: all 8 remaining bits
    assert v < 256
    return bytes(out)


def varints(tokens) -> bytes:
    return b"".join(zigzag_leb128(t) for t in tokens)


def payload(
    body: bytes,
    *,
    sig: int = 2,
    lowest: int = 1,
    highest: int = 1000,
    payload_len: int | None = None,
    cookie: int = UNCOMPRESSED_COOKIE,
    normalizing_offset: int = 0,
    ratio: float = 1.0,
) -> bytes:
    """An uncompressed V2 payload: 40-byte big-endian header, then ``body``."""
    if payload_len is None:
        payload_len = len(body)
    header = struct.pack(
        ">IIIIQQd", cookie, payload_len, normalizing_offset, sig, lowest, highest, ratio
    )
    assert len(header) == 40
    return header + body


def wrap(raw: bytes, *, cookie: int = COMPRESSED_COOKIE, length: int | None = None) -> bytes:
    """The compressed form of an uncompressed payload."""
    z = zlib.compress(raw)
    return struct.pack(">II", cookie, len(z) if length is None else length) + z


def layout(lowest=1, highest=1000, sig=2) -> Histogram:
    return Histogram(
        lowest_discernible_value=lowest, highest_trackable_value=highest, significant_figures=sig
    )


def python_sum(counts) -> int:
    return sum(int(c) for c in counts)


def assert_consistent(h: Histogram) -> None:
    """What every successfully decoded histogram must satisfy."""
    counts = h.counts()
    assert len(counts) == h.counts_len
    assert (counts >= 0).all()
    assert h.total_count == python_sum(counts)
    if h.total_count:
        nz = np.flatnonzero(counts)
        assert h.min <= h.max
        assert h.count_at_value(h.min) == counts[nz[0]]
        assert h.count_at_value(h.max) == counts[nz[-1]]
    else:
        assert (h.min, h.max) == (0, 0)


def assert_same_histogram(a: Histogram, b: Histogram) -> None:
    assert (a.lowest_discernible_value, a.highest_trackable_value, a.significant_figures) == (
        b.lowest_discernible_value,
        b.highest_trackable_value,
        b.significant_figures,
    )
    assert np.array_equal(a.counts(), b.counts())
    assert a.total_count == b.total_count
    assert (a.min, a.max) == (b.min, b.max)
    assert np.array_equal(a.values_at_percentiles(PERCENTILES), b.values_at_percentiles(PERCENTILES))
    assert a == b


def random_histogram(cfg, seed: int, n: int = 2000) -> tuple[Histogram, np.ndarray, np.ndarray]:
    lowest, highest, sig = cfg
    rng = np.random.default_rng(seed)
    top = min(highest, 2**62)
    magnitude = rng.uniform(0, np.log2(top), n)
    values = np.minimum(np.exp2(magnitude), top).astype(np.int64)
    values = np.clip(values, 0, highest)
    counts = rng.integers(1, 1000, n)
    h = layout(lowest, highest, sig)
    assert h.record_array(values, counts) == n
    return h, values, counts


def expect_decode_error(fn, data, match: str | None = None) -> str:
    with pytest.raises(HdrDecodeError, match=match) as info:
        fn(data)
    message = str(info.value)
    assert len(message) > 15, f"unhelpful message {message!r}"
    return message


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
@pytest.mark.parametrize("seed", [0, 1])
def test_random_histogram_survives_every_encoding(cfg, seed):
    h, _, _ = random_histogram(cfg, seed)
    assert h.total_count > 0
    text = h.encode()
    assert isinstance(text, str) and text.startswith("HISTF")
    assert_same_histogram(Histogram.decode(text), h)
    compressed = h.encode_compressed()
    assert isinstance(compressed, bytes)
    assert_same_histogram(Histogram.decode_compressed(compressed), h)
    raw = h.encode_uncompressed()
    assert isinstance(raw, bytes)
    assert_same_histogram(Histogram.decode_uncompressed(raw), h)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
def test_empty_histogram_round_trips_with_its_configuration(cfg):
    h = layout(cfg[0], cfg[1], cfg[2])
    for decoded in (
        Histogram.decode(h.encode()),
        Histogram.decode_compressed(h.encode_compressed()),
        Histogram.decode_uncompressed(h.encode_uncompressed()),
    ):
        assert decoded.total_count == 0
        assert_same_histogram(decoded, h)


@pytest.mark.parametrize("level", [-1, 0, 1, 6, 9])
def test_every_compression_level_decodes_to_the_same_histogram(level):
    h, _, _ = random_histogram(CONFIGS[0], 3)
    assert_same_histogram(Histogram.decode_compressed(h.encode_compressed(level)), h)


def test_compressed_form_has_cookie_and_length_header():
    h, _, _ = random_histogram(CONFIGS[0], 4, n=50)
    c = h.encode_compressed()
    cookie, length = struct.unpack(">II", c[:8])
    assert cookie == COMPRESSED_COOKIE
    assert length == len(c) - 8
    assert zlib.decompress(c[8:]) == h.encode_uncompressed()
    assert base64.b64decode(h.encode()) == c


def test_uncompressed_payload_header_is_standard():
    h = layout(3, 10**9, 4)
    h.record(12345)
    raw = h.encode_uncompressed()
    cookie, plen, norm, sig, lowest, highest, ratio = struct.unpack(">IIIIQQd", raw[:40])
    assert (cookie, norm, sig, lowest, highest, ratio) == (UNCOMPRESSED_COOKIE, 0, 4, 3, 10**9, 1.0)
    assert plen == len(raw) - 40


def test_decode_accepts_base64_str_base64_bytes_and_raw_compressed_bytes():
    h, _, _ = random_histogram(CONFIGS[0], 5, n=300)
    text = h.encode()
    assert_same_histogram(Histogram.decode(text), h)
    assert_same_histogram(Histogram.decode(text.encode("ascii")), h)
    assert_same_histogram(Histogram.decode(bytearray(text.encode("ascii"))), h)
    assert_same_histogram(Histogram.decode(h.encode_compressed()), h)
    assert_same_histogram(Histogram.decode(memoryview(h.encode_compressed())), h)


def test_decode_ignores_white_space_in_base64_text():
    h, _, _ = random_histogram(CONFIGS[0], 6, n=100)
    text = h.encode()
    spaced = "\n".join(text[i : i + 10] for i in range(0, len(text), 10)) + "\r\n"
    assert_same_histogram(Histogram.decode("  " + spaced), h)


def test_decode_rejects_non_string_input_with_type_error():
    with pytest.raises(TypeError):
        Histogram.decode(12345)


# ---------------------------------------------------------------- hdrh interop


@pytest.mark.parametrize("cfg", CONFIGS[:5], ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
def test_hdrh_encoding_decodes_to_the_same_histogram_as_recording_here(cfg):
    ours, values, counts = random_histogram(cfg, 7, n=500)
    theirs = HdrHistogram(*cfg)
    for v, c in zip(values.tolist(), counts.tolist()):
        theirs.record_value(v, c)
    decoded = Histogram.decode(theirs.encode())
    assert_same_histogram(decoded, ours)
    assert decoded.total_count == theirs.get_total_count()
    assert decoded.max == theirs.get_max_value()
    assert decoded.min == theirs.get_min_value()


@pytest.mark.parametrize("cfg", CONFIGS[:5], ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
def test_our_encoding_decodes_in_hdrh_to_the_same_statistics(cfg):
    ours, values, counts = random_histogram(cfg, 8, n=500)
    oracle = HdrHistogram(*cfg)
    for v, c in zip(values.tolist(), counts.tolist()):
        oracle.record_value(v, c)
    decoded = HdrHistogram.decode(ours.encode())
    assert decoded.get_total_count() == ours.total_count == oracle.get_total_count()
    assert decoded.get_max_value() == ours.max == oracle.get_max_value()
    assert decoded.get_min_value() == ours.min == oracle.get_min_value()
    for p in PERCENTILES:
        assert decoded.get_value_at_percentile(p) == oracle.get_value_at_percentile(p)
        assert ours.value_at_percentile(p) == oracle.get_value_at_percentile(p)
    for v in np.unique(values)[:50].tolist():
        assert decoded.get_count_at_value(v) == ours.count_at_value(v)


def test_empty_histogram_interoperates_both_ways():
    ours = layout(1, 3_600_000_000_000, 3)
    decoded = HdrHistogram.decode(ours.encode())
    assert decoded.get_total_count() == 0
    assert decoded.get_max_value() == 0
    back = Histogram.decode(HdrHistogram(1, 3_600_000_000_000, 3).encode())
    assert back.total_count == 0
    assert_same_histogram(back, ours)


def test_huge_counts_near_the_top_of_the_range_interoperate_both_ways():
    highest = 10**12
    ours = layout(1, highest, 3)
    assert ours.record_n(highest, 2**50)
    assert ours.record_n(highest // 2, 2**50 + 1)
    assert ours.record_n(1, 2**50)
    decoded = HdrHistogram.decode(ours.encode())
    assert decoded.get_total_count() == 3 * 2**50 + 1
    assert decoded.get_max_value() == ours.max == ours.highest_equivalent_value(highest)
    assert decoded.get_count_at_value(highest) == 2**50
    assert decoded.get_count_at_value(highest // 2) == 2**50 + 1
    assert decoded.get_value_at_percentile(99.9) == ours.value_at_percentile(99.9)

    theirs = HdrHistogram(1, highest, 3)
    theirs.record_value(highest, 2**50)
    theirs.record_value(highest // 2, 2**50 + 1)
    theirs.record_value(1, 2**50)
    back = Histogram.decode(theirs.encode())
    assert_same_histogram(back, ours)
    assert back.count_at_value(highest) == 2**50


# ------------------------------------------------------- hand-built payloads


def test_hand_built_payload_decodes_to_exactly_its_counts():
    # counts: [5, 0, 0, 0, 2**56, 0 (lone, Java style), 7, 0 (as a run of 1), 1, 300]
    tokens = [5, -3, 2**56, 0, 7, -1, 1, 300]
    expected = [5, 0, 0, 0, 2**56, 0, 7, 0, 1, 300]
    assert len(zigzag_leb128(2**56)) == 9
    body = varints(tokens)
    raw = payload(body, sig=2, lowest=1, highest=1000)
    want = np.zeros(layout(1, 1000, 2).counts_len, dtype=np.int64)
    want[: len(expected)] = expected

    for h in (
        Histogram.decode_uncompressed(raw),
        Histogram.decode_compressed(wrap(raw)),
        Histogram.decode(base64.b64encode(wrap(raw)).decode()),
    ):
        assert (h.lowest_discernible_value, h.highest_trackable_value, h.significant_figures) == (
            1,
            1000,
            2,
        )
        assert np.array_equal(h.counts(), want)
        assert h.total_count == sum(expected)
        assert h.min == 0
        assert h.max == h.highest_equivalent_value(9)
        assert h.count_at_value(4) == 2**56
        assert_consistent(h)


@pytest.mark.parametrize(
    "count",
    [2**56, 2**56 + 12345, 2**62, 2**62 + 1, INT64_MAX],
    ids=["2^56", "2^56+k", "2^62", "2^62+1", "int64max"],
)
def test_nine_byte_varint_counts_decode_exactly(count):
    encoded = zigzag_leb128(count)
    assert len(encoded) == 9
    raw = payload(varints([-10]) + encoded, sig=2, lowest=1, highest=1000)
    h = Histogram.decode_compressed(wrap(raw))
    assert h.count_at_value(10) == count
    assert h.total_count == count
    assert h.min == h.max == 10
    assert h.counts()[10] == count


def test_java_style_lone_zeros_and_zero_runs_decode_identically():
    java = payload(varints([3, 0, 4, 0, 0, 0, 5]))
    c_style = payload(varints([3, -1, 4, -3, 5]))
    a = Histogram.decode_compressed(wrap(java))
    b = Histogram.decode_compressed(wrap(c_style))
    assert_same_histogram(a, b)
    assert a.counts()[:7].tolist() == [3, 0, 4, 0, 0, 0, 5]
    assert a.total_count == 12


def test_leading_zero_run_sets_min_to_first_nonzero_bucket():
    h = Histogram.decode_uncompressed(payload(varints([-50, 2, -10, 3])))
    counts = h.counts()
    assert counts[50] == 2 and counts[61] == 3
    assert python_sum(counts) == 5
    assert h.min == h.lowest_equivalent_value(h.min)
    assert h.count_at_value(h.min) == 2
    assert h.count_at_value(h.max) == 3


def test_counts_filling_exactly_counts_len_are_accepted():
    n = layout(1, 1000, 2).counts_len
    h = Histogram.decode_compressed(wrap(payload(varints([1] * n))))
    assert h.total_count == n
    h2 = Histogram.decode_compressed(wrap(payload(varints([-(n - 1), 9]))))
    assert h2.total_count == 9
    assert h2.counts()[n - 1] == 9


def test_outer_cookie_word_size_nibble_is_ignored_like_hdrhistogram():
    raw = payload(varints([4]))
    h = Histogram.decode_compressed(wrap(raw, cookie=0x1C849304))
    assert h.total_count == 4


def test_our_payload_bytes_match_the_independent_encoder():
    h = layout(1, 1000, 2)
    h.record_n(0, 5)
    h.record_n(4, 2**56)
    h.record_n(6, 7)
    body = varints([5, -3, 2**56, -1, 7])
    assert h.encode_uncompressed() == payload(body, sig=2, lowest=1, highest=1000)


# ------------------------------------------------------------ malformed input

DECODERS = {
    "decode": Histogram.decode,
    "decode_compressed": Histogram.decode_compressed,
    "decode_uncompressed": Histogram.decode_uncompressed,
}


@pytest.mark.parametrize(
    "name,empty",
    [("decode", b""), ("decode", ""), ("decode", "  \n"), ("decode_compressed", b""), ("decode_uncompressed", b"")],
)
def test_empty_input_raises_decode_error(name, empty):
    expect_decode_error(DECODERS[name], empty)


def small_valid_compressed() -> bytes:
    h = layout(1, 10**6, 2)
    for v, c in [(1, 3), (17, 1), (900, 2), (123456, 5)]:
        h.record_n(v, c)
    return h.encode_compressed()


def test_every_truncation_of_a_compressed_histogram_is_rejected():
    good = small_valid_compressed()
    assert Histogram.decode_compressed(good).total_count == 11
    for n in range(len(good)):
        expect_decode_error(Histogram.decode_compressed, good[:n])
        expect_decode_error(Histogram.decode, good[:n] if n >= 3 else base64.b64encode(good[:n]))


def test_every_truncation_of_the_zlib_stream_with_a_matching_length_is_rejected():
    good = small_valid_compressed()
    z = good[8:]
    for n in range(len(z)):
        data = struct.pack(">II", COMPRESSED_COOKIE, n) + z[:n]
        expect_decode_error(Histogram.decode_compressed, data)


def test_every_truncation_of_an_uncompressed_payload_is_rejected():
    raw = zlib.decompress(small_valid_compressed()[8:])
    for n in range(len(raw)):
        expect_decode_error(Histogram.decode_uncompressed, raw[:n])


def test_each_byte_inverted_in_a_compressed_histogram_fails_cleanly_or_stays_consistent():
    good = small_valid_compressed()
    failures = 0
    for i in range(len(good)):
        bad = bytearray(good)
        bad[i] ^= 0xFF
        try:
            h = Histogram.decode_compressed(bytes(bad))
        except HdrDecodeError as e:
            assert str(e)
            failures += 1
        else:
            assert_consistent(h)
    # the cookie, the length and the zlib checksum catch nearly every flip
    assert failures >= len(good) - 2


@FUZZ
@given(
    position=st.integers(min_value=0, max_value=10_000),
    mask=st.integers(min_value=1, max_value=255),
    flips=st.integers(min_value=1, max_value=3),
)
def test_bit_flips_inside_the_payload_fail_cleanly_or_decode_consistently(position, mask, flips):
    raw = bytearray(zlib.decompress(small_valid_compressed()[8:]))
    for k in range(flips):
        raw[(position + 7 * k) % len(raw)] ^= mask
    raw = bytes(raw)
    outcomes = []
    for decode, data in (
        (Histogram.decode_uncompressed, raw),
        (Histogram.decode_compressed, wrap(raw)),
    ):
        try:
            h = decode(data)
        except HdrDecodeError as e:
            assert str(e)
            outcomes.append(None)
        else:
            assert_consistent(h)
            outcomes.append(h)
    # both decoders validate the same payload the same way
    assert (outcomes[0] is None) == (outcomes[1] is None)
    if outcomes[0] is not None:
        assert_same_histogram(outcomes[0], outcomes[1])


@FUZZ
@given(
    data=st.one_of(
        st.binary(max_size=300),
        st.binary(max_size=300).map(lambda b: struct.pack(">I", COMPRESSED_COOKIE) + b),
        st.binary(max_size=300).map(lambda b: struct.pack(">II", COMPRESSED_COOKIE, len(b)) + b),
        st.binary(max_size=300).map(
            lambda b: struct.pack(">II", COMPRESSED_COOKIE, len(b) + 2) + b"\x78\x9c" + b
        ),
        st.binary(max_size=300).map(lambda b: struct.pack(">I", UNCOMPRESSED_COOKIE) + b),
    )
)
def test_random_bytes_never_crash_any_decoder(data):
    for decode in DECODERS.values():
        try:
            h = decode(data)
        except HdrDecodeError as e:
            assert str(e)
        else:
            assert_consistent(h)


@FUZZ
@given(
    sig=st.integers(min_value=0, max_value=7),
    lowest=st.sampled_from([0, 1, 2, 1000, 2**40, 2**62, 2**63, 2**64 - 1]),
    highest=st.sampled_from([0, 1, 2, 1000, 10**6, 2**40, 2**62, INT64_MAX, 2**63, 2**64 - 1]),
    normalizing=st.sampled_from([0, 0, 0, 1, 2**31]),
    tokens=st.lists(st.integers(min_value=-(2**63), max_value=INT64_MAX), max_size=20),
    len_delta=st.sampled_from([0, 0, 0, -1, 1, 2**20]),
    extra=st.binary(max_size=3),
)
def test_random_structured_payloads_fail_cleanly_or_decode_consistently(
    sig, lowest, highest, normalizing, tokens, len_delta, extra
):
    body = varints(tokens) + extra
    plen = max(0, min(len(body) + len_delta, 2**32 - 1))
    raw = payload(
        body, sig=sig, lowest=lowest, highest=highest, payload_len=plen,
        normalizing_offset=normalizing,
    )
    for decode, data in ((Histogram.decode_uncompressed, raw), (Histogram.decode_compressed, wrap(raw))):
        try:
            h = decode(data)
        except HdrDecodeError as e:
            assert str(e)
        else:
            assert_consistent(h)
            assert (h.lowest_discernible_value, h.highest_trackable_value, h.significant_figures) == (
                lowest,
                highest,
                sig,
            )


def test_wrong_outer_cookie_is_rejected_naming_the_cookie():
    raw = payload(varints([1]))
    msg = expect_decode_error(Histogram.decode_compressed, wrap(raw, cookie=0xDEADBEEF), "cookie")
    assert "0xdeadbeef" in msg.lower()
    expect_decode_error(Histogram.decode, base64.b64encode(wrap(raw, cookie=0xDEADBEEF)))


def test_v1_cookie_is_rejected_as_unsupported():
    data = wrap(payload(varints([1])), cookie=V1_COMPRESSED_COOKIE)
    msg = expect_decode_error(Histogram.decode_compressed, data, "cookie")
    assert "0x1c849302" in msg.lower()
    expect_decode_error(Histogram.decode, data)  # raw bytes that share the cookie prefix


def test_uncompressed_payload_given_to_decode_compressed_is_named_as_such():
    raw = payload(varints([1, 2]))
    expect_decode_error(Histogram.decode_compressed, raw, "uncompressed")
    expect_decode_error(Histogram.decode, raw, "uncompressed")


def test_compressed_histogram_given_to_decode_uncompressed_is_named_as_such():
    expect_decode_error(Histogram.decode_uncompressed, small_valid_compressed(), "compressed")


@pytest.mark.parametrize("delta", [-1, 1, 1000, -8])
def test_outer_length_field_disagreeing_with_the_data_is_rejected(delta):
    good = small_valid_compressed()
    length = len(good) - 8 + delta
    bad = struct.pack(">II", COMPRESSED_COOKIE, length) + good[8:]
    expect_decode_error(Histogram.decode_compressed, bad, "header says")


@pytest.mark.parametrize("sig", [0, 6, 2**32 - 1])
def test_inner_significant_figures_outside_1_to_5_are_rejected(sig):
    raw = payload(varints([1]), sig=sig)
    expect_decode_error(Histogram.decode_compressed, wrap(raw), "significant figures")
    expect_decode_error(Histogram.decode_uncompressed, raw, "significant figures")


@pytest.mark.parametrize(
    "lowest,highest",
    [(0, 1000), (2**63, 2**63 + 10), (1, 2**63), (1, 2**64 - 1)],
    ids=["lowest0", "lowest-above-int64", "highest-above-int64", "highest-u64-max"],
)
def test_inner_value_range_outside_int64_or_lowest_zero_is_rejected(lowest, highest):
    raw = payload(b"", lowest=lowest, highest=highest)
    expect_decode_error(Histogram.decode_compressed, wrap(raw), "range")
    expect_decode_error(Histogram.decode_uncompressed, raw, "range")


@pytest.mark.parametrize("lowest,highest", [(1000, 1999), (10, 10), (5, 0), (2**62, INT64_MAX)])
def test_inner_highest_below_twice_lowest_is_rejected(lowest, highest):
    raw = payload(b"", lowest=lowest, highest=highest)
    expect_decode_error(Histogram.decode_compressed, wrap(raw), "invalid histogram")
    expect_decode_error(Histogram.decode_uncompressed, raw, "invalid histogram")


def test_non_zero_normalizing_offset_is_rejected():
    raw = payload(varints([1]), normalizing_offset=3)
    expect_decode_error(Histogram.decode_compressed, wrap(raw), "normalizing")
    expect_decode_error(Histogram.decode_uncompressed, raw, "normalizing")


def test_inner_payload_length_larger_than_the_data_is_rejected():
    body = varints([1, 2, 3])
    raw = payload(body, payload_len=len(body) + 1)
    expect_decode_error(Histogram.decode_compressed, wrap(raw), "truncated")
    expect_decode_error(Histogram.decode_uncompressed, raw, "header says")


def test_inner_payload_length_smaller_than_the_data_is_rejected():
    body = varints([1, 2, 3])
    raw = payload(body, payload_len=len(body) - 1)
    expect_decode_error(Histogram.decode_compressed, wrap(raw), "longer")
    expect_decode_error(Histogram.decode_uncompressed, raw, "header says")


def test_inner_payload_length_beyond_what_the_range_can_need_is_rejected():
    raw = payload(b"", payload_len=2**32 - 1)
    expect_decode_error(Histogram.decode_compressed, wrap(raw), "more than")


def test_more_varints_than_counts_len_are_rejected():
    n = layout(1, 1000, 2).counts_len
    raw = payload(varints([1] * (n + 1)))
    expect_decode_error(Histogram.decode_compressed, wrap(raw), "more counts")
    expect_decode_error(Histogram.decode_uncompressed, raw, "more counts")


@pytest.mark.parametrize("tokens_for", ["run-too-long", "run-then-count", "huge-run", "int64-min-run"])
def test_zero_runs_past_counts_len_are_rejected(tokens_for):
    n = layout(1, 1000, 2).counts_len
    tokens = {
        "run-too-long": [-(n + 1)],
        "run-then-count": [-n, 1],
        "huge-run": [1, -(2**62)],
        "int64-min-run": [1, -(2**63)],
    }[tokens_for]
    raw = payload(varints(tokens))
    expect_decode_error(Histogram.decode_compressed, wrap(raw), "more counts")
    expect_decode_error(Histogram.decode_uncompressed, raw, "more counts")


@pytest.mark.parametrize("tail", [b"\x80", b"\xff\xff", b"\x80" * 8], ids=["1", "2", "8"])
def test_truncated_varint_at_the_end_is_rejected(tail):
    raw = payload(varints([1, 2]) + tail)
    expect_decode_error(Histogram.decode_compressed, wrap(raw), "truncated")
    expect_decode_error(Histogram.decode_uncompressed, raw, "truncated")


def test_counts_whose_total_overflows_int64_are_rejected():
    raw = payload(varints([2**62, 2**62]))
    expect_decode_error(Histogram.decode_compressed, wrap(raw), "overflow")
    expect_decode_error(Histogram.decode_uncompressed, raw, "overflow")


def test_stream_inflating_past_the_declared_payload_is_rejected():
    body = varints([1, 2, 3])
    raw = payload(body) + b"\x02\x02\x02extra"  # header still says len(body)
    expect_decode_error(Histogram.decode_compressed, wrap(raw), "longer")


def test_stream_shorter_than_the_payload_header_is_rejected():
    z = zlib.compress(payload(b"")[:30])
    data = struct.pack(">II", COMPRESSED_COOKIE, len(z)) + z
    expect_decode_error(Histogram.decode_compressed, data, "40-byte")


def test_zip_bomb_fails_fast_without_inflating_it():
    header = payload(b"", payload_len=4)
    comp = zlib.compressobj(1)
    chunk = bytes(1 << 20)
    parts = [comp.compress(header)]
    for _ in range(100):  # 100 MiB of zeros
        parts.append(comp.compress(chunk))
    parts.append(comp.flush())
    z = b"".join(parts)
    assert len(z) < 1_000_000
    bomb = struct.pack(">II", COMPRESSED_COOKIE, len(z)) + z
    start = time.perf_counter()
    expect_decode_error(Histogram.decode_compressed, bomb, "longer")
    expect_decode_error(Histogram.decode, base64.b64encode(bomb))
    assert time.perf_counter() - start < 1.0


def test_zlib_garbage_after_a_valid_header_is_reported_as_corrupt():
    good = small_valid_compressed()
    z = bytearray(good[8:])
    z[0] = 0x00  # not a zlib stream header any more
    bad = struct.pack(">II", COMPRESSED_COOKIE, len(z)) + bytes(z)
    expect_decode_error(Histogram.decode_compressed, bad)


@pytest.mark.parametrize("char", ["*", "!", "-", "_", "\x00", "é", "."])
def test_invalid_base64_character_is_rejected_with_its_position(char):
    text = small_valid_compressed()
    enc = base64.b64encode(text).decode()
    bad = enc[:10] + char + enc[10:]
    msg = expect_decode_error(Histogram.decode, bad, "invalid base64 character")
    assert "11" in msg


@pytest.mark.parametrize("text", ["QQ==QQ==", "QQ=A", "HISTF=AAAA"])
def test_base64_with_data_after_padding_is_rejected(text):
    expect_decode_error(Histogram.decode, text, "padding")


def test_valid_histogram_base64_with_data_after_padding_is_rejected():
    enc = Histogram(highest_trackable_value=1000).encode()
    enc = enc if enc.endswith("=") else enc + "="
    expect_decode_error(Histogram.decode, enc + "AAAA", "padding")


@pytest.mark.parametrize("text", ["A", "AAAAA", "QQ==="])
def test_base64_of_impossible_length_is_rejected(text):
    expect_decode_error(Histogram.decode, text, "length")


def test_non_ascii_bytes_that_are_not_a_histogram_are_rejected():
    expect_decode_error(Histogram.decode, b"\xff\xfe\x00garbage")


@pytest.mark.parametrize("kind", ["preset-dictionary", "gzip", "raw-deflate"])
def test_streams_that_are_not_plain_zlib_are_rejected_as_corrupt(kind):
    raw = payload(varints([1, 2, 3]))
    if kind == "preset-dictionary":
        c = zlib.compressobj(zdict=b"dictionary" * 4)
        z = c.compress(raw) + c.flush()
    elif kind == "gzip":
        c = zlib.compressobj(wbits=31)
        z = c.compress(raw) + c.flush()
    else:
        c = zlib.compressobj(wbits=-15)
        z = c.compress(raw) + c.flush()
    data = struct.pack(">II", COMPRESSED_COOKIE, len(z)) + z
    expect_decode_error(Histogram.decode_compressed, data, "corrupt")
