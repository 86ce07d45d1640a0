"""Inputs the fuzzers (scripts/fuzz.sh) found to crash a parser, kept as plain tests, and
a replay of every seed corpus through its fuzz target. No atheris needed: the targets
in tests/fuzz/targets.py are plain functions that raise on a crash (an exception the
parser does not document, or a broken invariant)."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

import loadgen
from loadgen.engine.trace import load_trace
from loadgen.options import OptionError, resolve
from loadgen.stats.hdrlog import HistogramLogError, read_log

FUZZ_DIR = pathlib.Path(__file__).resolve().parents[1] / "fuzz"
CORPUS = FUZZ_DIR / "corpus"


def _targets():
    spec = importlib.util.spec_from_file_location("loadgen_fuzz_targets", FUZZ_DIR / "targets.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TARGETS


TARGETS = _targets()
SEEDS = sorted(p for p in CORPUS.glob("*/*") if p.parent.name in TARGETS)


def test_every_fuzz_target_has_a_seed_corpus():
    for name in [*TARGETS, "hdr_codec", "http_parser", "sse_scanner"]:
        assert any((CORPUS / name).iterdir()), name


@pytest.mark.parametrize("path", SEEDS, ids=[f"{p.parent.name}/{p.name}" for p in SEEDS])
def test_seed_corpus_input_parses_without_crashing(path):
    TARGETS[path.parent.name](path.read_bytes())


# ------------------------------------------------------------ found by the fuzzers


def test_hdrlog_reader_calls_a_binary_file_not_a_log(tmp_path):
    # hdrlog target: a single byte 0x8a raised UnicodeDecodeError out of read_log.
    path = tmp_path / "binary.hlog"
    path.write_bytes(b"\x8a")
    with pytest.raises(HistogramLogError, match="not an HdrHistogram log"):
        read_log(str(path))
    TARGETS["hdrlog"](b"\x8a")


def test_hdrlog_reader_names_a_binary_tail_after_good_lines(tmp_path):
    h = loadgen.Histogram()
    h.record(1000)
    path = tmp_path / "tail.hlog"
    path.write_bytes(f"0.000,1.000,0.001,{h.encode()}\n".encode() + bytes(range(128, 256)) * 100)
    with pytest.raises(HistogramLogError, match="not UTF-8"):
        read_log(str(path))


def test_config_file_that_is_not_utf8_is_an_option_error(tmp_path):
    # options_config target: tomllib let UnicodeDecodeError through.
    path = tmp_path / "run.toml"
    path.write_bytes(b'scenar\xff\xff = "server"\ntarget-qps = 1ion-s = 2\n')
    with pytest.raises(OptionError, match="--config"):
        resolve({"config": str(path)}, environ={})


def test_npy_trace_with_a_corrupt_header_is_a_value_error(tmp_path):
    # trace target: numpy's header parser raised tokenize.TokenError.
    path = tmp_path / "trace.npy"
    path.write_bytes(b"\x93NUMPY\x01\x00v\x00{'descr': '<f'fortran_order': False, 'shape': (3,\x00), }"
                     + b" " * 13 + b"\xdc\xdf<f'fortran_orde" + b" " * 30 + b"\n" + np.zeros(3).tobytes())
    with pytest.raises(ValueError, match="trace.npy"):
        load_trace(str(path))


def test_kserve_response_nested_too_deeply_is_reported_not_raised():
    # kserve_json target: json.loads raised RecursionError out of the response check.
    from loadgen.net.kserve_common import check_json_response

    problem = check_json_response(b"[" * 5000, [])
    assert problem is not None and "not JSON" in problem


def test_kserve_response_with_an_infinite_dimension_is_reported_not_raised():
    # kserve_json target: int(1e400) raised OverflowError out of the response check.
    from loadgen.net.kserve_common import check_json_response

    problem = check_json_response(b'{"outputs":[{"name":"OUTPUT0","shape":[1e400]}]}', [])
    assert problem is not None and "shape" in problem


def test_sse_event_nested_too_deeply_fails_the_query_not_the_client():
    # sse target: json.loads raised RecursionError out of TokenStream.on_data, through the
    # connection's data_received, and the query never ended.
    TARGETS["sse"](b"\x01" + b'data: {"usage":' + b"[" * 5000 + b"}\n\n")
