"""Reading back what loadgen wrote, when it is not what loadgen wrote: ``loadgen report``
and ``load_result``/``load_results`` on result documents of the wrong shape (checked
against the shipped ``loadgen.result/1`` JSON Schema), and ``loadgen hlog`` on files that
are not interval logs. Each is exit 2 naming the file and the key or line, never a
traceback; and every document loadgen itself writes passes the schema.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from importlib.resources import files
from pathlib import Path

import pytest

import loadgen
from loadgen.options import RunOptions
from loadgen.results import load_result
from loadgen.results.schema import MAX_DEPTH, SchemaError, check_result, format_path, result_schema
from loadgen.runner import run_benchmark
from loadgen.scenarios import SCENARIOS
from loadgen.stats.hdrlog import HistogramLogError, read_log

from tests.servers.scripted_proc import start_scripted
from tests.helpers import run_cli

TIMEOUT_S = 60
ROOT = Path(__file__).resolve().parents[2]



def assert_usage_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr, (fragment, proc.stderr)


@pytest.fixture(scope="module")
def good_doc(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A result document as `loadgen run` writes it."""
    out = tmp_path_factory.mktemp("good") / "out"
    proc = run_cli("run", "--scenario", "constant", "--sut", "null", "--target-qps", "200", "--duration-s", "0.2",
                   "--max-issue-delay-ms", "100", "--quiet", "--output", out)
    assert proc.returncode in (0, 1), proc.stderr
    doc = json.loads((out / "result.json").read_text())
    assert run_cli("report", out / "result.json").returncode == proc.returncode
    return doc


def _changed(doc: dict, change) -> dict:
    doc = copy.deepcopy(doc)
    change(doc)
    return doc


# (id, change to a good document, the key path the error names, what it says)
WRONG_TYPES = [
    ("throughput-an-array", lambda d: d.update(throughput=[]), "'throughput'", "must be an object, not an array"),
    ("duration-a-string", lambda d: d.update(duration_s="abc"), "'duration_s'", "must be a number, not a string"),
    ("counts-missing", lambda d: d.pop("counts"), "'counts'", "is missing"),
    ("metric-missing", lambda d: d.pop("metric"), "'metric'", "is missing"),
    ("count-a-string", lambda d: d["counts"].update(completed="7"), "'counts.completed'", "must be an integer"),
    ("count-negative", lambda d: d["counts"].update(failed=-1), "'counts.failed'", "must be >= 0"),
    ("percentile-null", lambda d: d["latency_ns"].update(p99=None), "'latency_ns.p99'", "must be a number, not null"),
    ("percentile-key-missing", lambda d: d["latency_ns"].pop("p99.9"), "'latency_ns[\"p99.9\"]'", "is missing"),
    ("histogram-an-array", lambda d: d.update(service_time_ns=[1, 2]), "'service_time_ns'", "must be an object"),
    ("valid-a-string", lambda d: d.update(valid="yes"), "'valid'", "must be a boolean"),
    ("metric-value-a-boolean", lambda d: d["metric"].update(value=True), "'metric.value'", "must be a number"),
    ("reasons-an-object", lambda d: d.update(invalid_reasons={}), "'invalid_reasons'", "must be an array"),
    ("timeseries-point-time", lambda d: d["timeseries"][0].update(t_s="0"), "'timeseries[0].t_s'", "must be a number"),
    ("threshold-not-an-object", lambda d: d.update(thresholds=[1]), "'thresholds[0]'", "must be an object"),
    ("early-stopping-message", lambda d: d.update(early_stopping={"message": 3}), "'early_stopping.message'",
     "must be a string"),
    ("sut-histogram-count", lambda d: d.update(queue_wait_ns={**d["latency_ns"], "count": 1.5}),
     "'queue_wait_ns.count'", "must be an integer"),
    ("error-counts", lambda d: d["errors"].update(counts={"http_500": "many"}), "'errors.counts.http_500'",
     "must be an integer"),
    ("network-target", lambda d: d.update(network={"target": 80}), "'network.target'", "must be a string"),
    ("server-metrics-deltas", lambda d: d.update(server_metrics={"scrapes": 2, "failed_scrapes": 0, "deltas": []}),
     "'server_metrics.deltas'", "must be an object"),
]


@pytest.mark.integration
@pytest.mark.parametrize("change,path,problem", [w[1:] for w in WRONG_TYPES], ids=[w[0] for w in WRONG_TYPES])
def test_report_of_a_result_with_a_wrong_type_is_exit_2_naming_file_and_key(good_doc, tmp_path, change, path,
                                                                              problem):
    bad = tmp_path / "result.json"
    bad.write_text(json.dumps(_changed(good_doc, change)))
    assert_usage_error(run_cli("report", bad), str(bad), path, problem)
    with pytest.raises(ValueError, match="not a valid loadgen.result/1 document") as e:
        load_result(bad)
    assert str(bad) in str(e.value) and path in str(e.value)


def _replace_value(text: str, key: str, value: str) -> str:
    """The document's JSON text with the first ``"key": <number>`` given ``value`` as
    written (numbers JSON can say but Python would not write)."""
    start = text.index(f'"{key}": ') + len(key) + 4
    end = start
    while text[end] not in ",}\n":
        end += 1
    return text[:start] + value + text[end:]


NUMBERS = [
    ("int-of-400-digits", "duration_s", "1" + "0" * 400, "'duration_s' is a number of 401 digits"),
    ("percentile-of-400-digits", "p50", "9" * 400, "'latency_ns.p50' is a number of 400 digits"),
    ("float-overflowing-to-inf", "duration_s", "1e400", "'duration_s' is inf"),
    ("negative-inf", "issue_duration_s", "-1e999", "'issue_duration_s' is -inf"),
    ("nan", "completed_qps", "NaN", "'throughput.completed_qps' is nan"),
    ("infinity-literal", "mean", "Infinity", "'latency_ns.mean' is inf"),
    ("int-of-5000-digits", "duration_s", "7" * 5000, "is not a loadgen result"),
]


@pytest.mark.integration
@pytest.mark.parametrize("key,value,message", [n[1:] for n in NUMBERS], ids=[n[0] for n in NUMBERS])
def test_report_of_a_result_with_an_unusable_number_is_exit_2(good_doc, tmp_path, key, value, message):
    bad = tmp_path / "result.json"
    bad.write_text(_replace_value(json.dumps(good_doc, indent=2), key, value))
    assert_usage_error(run_cli("report", bad), str(bad), message)
    assert_usage_error(run_cli("report", "--json", bad), str(bad), message)


@pytest.mark.integration
@pytest.mark.parametrize("where", ["document", "inside-a-key"])
def test_report_of_json_nested_100k_deep_is_exit_2(tmp_path, where):
    deep = "[" * 100_000 + "]" * 100_000
    text = deep if where == "document" else '{"schema": "loadgen.result/1", "extra": ' + deep + "}"
    bad = tmp_path / "result.json"
    bad.write_text(text)
    assert_usage_error(run_cli("report", bad), str(bad), "nested too deeply")
    with pytest.raises(ValueError, match="nested too deeply"):
        load_result(bad)


def test_a_document_nested_deeper_than_the_limit_names_where(good_doc, tmp_path):
    # Deep enough to be a problem for recursive readers, not deep enough for json.loads.
    deep: object = 1
    for _ in range(MAX_DEPTH + 10):
        deep = [deep]
    bad = tmp_path / "result.json"
    bad.write_text(json.dumps({**good_doc, "extra": {"list": deep}}))
    with pytest.raises(ValueError, match=r"'extra.list(\[0\])+' is nested more than 64 levels deep"):
        load_result(bad)


@pytest.mark.integration
def test_report_of_a_binary_result_json_is_exit_2(tmp_path):
    bad = tmp_path / "result.json"
    bad.write_bytes(bytes(range(256)) * 10)
    assert_usage_error(run_cli("report", bad), str(bad), "not UTF-8")


def test_load_results_names_the_file_and_key_of_a_bad_result(good_doc, tmp_path):
    pytest.importorskip("pandas")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "result.json").write_text(json.dumps(good_doc))
    bad = tmp_path / "b" / "result.json"
    bad.write_text(json.dumps(_changed(good_doc, lambda d: d["counts"].update(issued=[]))))
    with pytest.raises(ValueError, match=r"b/result.json is not a valid .*'counts.issued' must be an integer"):
        loadgen.load_results(tmp_path)
    assert len(loadgen.load_results(tmp_path / "a")) == 1


def test_the_good_document_and_the_json_schema_agree(good_doc):
    check_result(good_doc)
    jsonschema = pytest.importorskip("jsonschema")  # not a dependency; when present, a cross-check
    jsonschema.Draft202012Validator.check_schema(result_schema())
    jsonschema.validate(good_doc, result_schema(), cls=jsonschema.Draft202012Validator)


def test_a_partial_document_needs_only_what_was_measured(good_doc):
    keep = ("schema", "scenario", "sut", "valid", "invalid_reasons", "interrupted", "started_at_epoch_s",
            "duration_s", "issue_duration_s", "settings", "counts", "thresholds", "latency_ns")
    partial = {k: good_doc[k] for k in keep}
    with pytest.raises(SchemaError, match="'metric' is missing"):
        check_result(partial)
    check_result({**partial, "partial": True})


@pytest.mark.integration
def test_report_of_a_partial_result_says_so(good_doc, tmp_path):
    keep = ("schema", "scenario", "sut", "valid", "invalid_reasons", "interrupted", "duration_s",
            "issue_duration_s", "settings", "counts", "thresholds")
    path = tmp_path / "result.json"
    path.write_text(json.dumps({**{k: good_doc[k] for k in keep}, "valid": False, "partial": True}))
    assert_usage_error(run_cli("report", path), str(path), "partial result", "--json")
    proc = run_cli("report", "--json", path)
    assert proc.returncode == 1 and json.loads(proc.stdout)["partial"] is True


def test_key_paths_are_written_as_a_reader_would_look_them_up():
    assert format_path(("throughput",)) == "throughput"
    assert format_path(("latency_ns", "p99.9")) == 'latency_ns["p99.9"]'
    assert format_path(("timeseries", 3, "qps")) == "timeseries[3].qps"
    assert format_path(()) == ""


def test_the_schema_ships_in_the_package_and_the_validator_knows_its_every_keyword():
    text = files("loadgen.results").joinpath("result.schema.json").read_text(encoding="utf-8")
    schema = json.loads(text)
    assert schema["$schema"].endswith("/draft/2020-12/schema") and schema["title"] == "loadgen.result/1"
    check_result({"schema": "loadgen.result/1", "partial": True, "scenario": "s", "sut": "null", "valid": False,
                  "invalid_reasons": [], "interrupted": False, "duration_s": 0, "issue_duration_s": 0,
                  "settings": {}, "counts": {k: 0 for k in ("issued", "completed", "failed", "timed_out",
                                                            "cancelled")}, "thresholds": []})
    tomllib = pytest.importorskip("tomllib")
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "*.json" in data["tool"]["setuptools"]["package-data"]["loadgen.results"]


def test_every_scenario_writes_a_document_that_follows_the_schema(tmp_path):
    trace = tmp_path / "trace.txt"
    trace.write_text("\n".join(str(i) for i in range(0, 50, 2)))
    per_scenario = {
        "server": {"duration_s": 0.1, "min_duration_s": 0.1, "min_query_count": 10},
        "single-stream": {"min_duration_s": 0.1, "min_query_count": 10},
        "multi-stream": {"min_duration_s": 0.1, "min_query_count": 10},
        "offline": {"query_count": 100, "min_duration_s": 0.1, "min_query_count": 10},
        "ramp": {"stages": "0.1s:100"},
        "trace": {"trace": str(trace)},
    }
    for name in SCENARIOS:
        kw = per_scenario.get(name, {"duration_s": 0.1})
        doc = run_benchmark(RunOptions(scenario=name, sut="null", max_issue_delay_ms=100.0,
                                       fail_if=["p99>10s"], **kw))
        check_result(json.loads(json.dumps(doc)))  # as read back from the file


@pytest.mark.integration
def test_network_documents_follow_the_schema(tmp_path):
    with start_scripted(tmp_path, "--ttft-ms", "1", "--itl-ms", "0.2", "--tokens", "4") as server:
        runs = [
            ["--sut", f"{server.url}/v2/models/m/infer", "--input", "INPUT0:FP32:1x16",
             "--server-metrics-url", f"{server.url}/metrics"],
            ["--sut", f"openai+{server.url}/v1/completions", "--model", "m"],
        ]
        for args in runs:
            out = tmp_path / f"out{runs.index(args)}"
            proc = run_cli("run", "--scenario", "constant", "--target-qps", "100", "--duration-s", "0.2",
                           "--max-issue-delay-ms", "100", "--ready-timeout-s", "5", "--quiet", "--output", out, *args)
            assert proc.returncode in (0, 1), proc.stderr
            doc = load_result(out / "result.json")
            assert "network" in doc
            assert run_cli("report", out).returncode == proc.returncode


# ----------------------------------------------------------------------------- hlog


@pytest.mark.integration
def test_hlog_of_a_binary_file_is_exit_2_not_an_hdrhistogram_log(tmp_path):
    path = tmp_path / "random.hlog"
    path.write_bytes(os.urandom(4096) + b"\xff")
    assert_usage_error(run_cli("hlog", path), str(path), "not an HdrHistogram log")


@pytest.mark.integration
def test_hlog_of_a_file_with_nul_bytes_is_exit_2_not_an_hdrhistogram_log(tmp_path):
    path = tmp_path / "zeros.hlog"
    path.write_bytes(b"\x00\x01\x02 valid UTF-8 but binary\n" * 4)
    assert_usage_error(run_cli("hlog", path), str(path), "not an HdrHistogram log", "line 1")


def test_hlog_reader_names_the_line_that_is_not_text(tmp_path):
    h = loadgen.Histogram()
    h.record(1000)
    good = f"0.000,1.000,0.001,{h.encode()}\n".encode()
    # A block of good lines longer than a text stream's read-ahead, then binary.
    path = tmp_path / "tail.hlog"
    path.write_bytes(good * 300 + b"\x89PNG\r\n\x1a\n")
    with pytest.raises(HistogramLogError, match="not an HdrHistogram log: line 301 is not UTF-8 text"):
        read_log(str(path))
    path.write_bytes(good * 2 + b"1.0,\x00\x00\n")
    with pytest.raises(HistogramLogError, match="line 3 holds binary data"):
        read_log(str(path))
    path.write_bytes(good * 3)
    assert len(read_log(str(path))) == 3


def test_hlog_reader_still_reads_text_streams_and_crlf_lines(tmp_path):
    import io

    h = loadgen.Histogram()
    h.record(5000)
    text = f"#[BaseTime: 10.000 (seconds since epoch)]\r\n0.000,1.000,0.005,{h.encode()}\r\n"
    entries = read_log(io.StringIO(text))
    assert len(entries) == 1 and entries[0].absolute_start_s == 10.0
    path = tmp_path / "crlf.hlog"
    path.write_bytes(text.encode())
    assert read_log(str(path))[0].histogram.total_count == 1
