"""Scenarios, option resolution and thresholds in process (no subprocess): scenario
defaults, the precedence merge, stage and duration parsing, threshold expressions, and
a few short runs through loadgen.runner.run_benchmark."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from loadgen.options import (
    OPTION_SPECS,
    OptionError,
    RunOptions,
    parse_duration_s,
    parse_stages,
    resolve,
)
from loadgen.results import THRESHOLD_METRICS, ThresholdError, evaluate_thresholds, parse_threshold
from loadgen.runner import prepare, run_benchmark
from loadgen.scenarios import SCENARIOS, get_scenario


def effective(**kw) -> RunOptions:
    return get_scenario(kw.get("scenario", "server")).effective(RunOptions(**kw))


# ------------------------------------------------------------------ scenario defaults


def test_every_scenario_name_is_registered():
    assert set(SCENARIOS) == {"single-stream", "multi-stream", "server", "offline", "constant",
                              "poisson", "concurrency", "ramp", "trace"}
    with pytest.raises(ValueError, match="unknown scenario 'nope'.*single-stream"):
        get_scenario("nope")


def test_single_stream_defaults_to_p90_one_sample_and_mlperf_minimums():
    o = effective(scenario="single-stream")
    assert o.latency_percentile == 90.0
    assert o.samples_per_query == 1
    assert o.min_duration_s == 10.0 and o.min_query_count == 100
    assert o.latency_bound_ms is None  # optional outside server
    s = get_scenario("single-stream").engine_settings(o)
    assert s.mode == "closed" and s.concurrency == 1


def test_multi_stream_defaults_to_8_samples_per_query_at_p99():
    o = effective(scenario="multi-stream")
    assert o.samples_per_query == 8
    assert o.latency_percentile == 99.0
    assert get_scenario("multi-stream").engine_settings(o).samples_per_query == 8
    assert effective(scenario="multi-stream", samples_per_query=3).samples_per_query == 3


def test_server_defaults_to_1000_qps_and_a_10_ms_bound_at_p99():
    o = effective(scenario="server")
    assert o.target_qps == 1000.0
    assert o.latency_bound_ms == 10.0
    assert o.latency_percentile == 99.0
    assert get_scenario("server").engine_settings(o).mode == "poisson"
    o = effective(scenario="server", target_qps=50.0, latency_bound_ms=2.5)
    assert (o.target_qps, o.latency_bound_ms) == (50.0, 2.5)


def test_mlperf_duration_means_the_minimum_duration():
    o = effective(scenario="server", duration_s=3.0)
    assert o.min_duration_s == 3.0 and o.duration_s is None
    # Beside --min-duration-s it is a floor too, never a cap: the longer of the two.
    o = effective(scenario="server", duration_s=3.0, min_duration_s=1.0)
    assert o.min_duration_s == 3.0 and o.duration_s is None
    o = effective(scenario="server", duration_s=1.0, min_duration_s=3.0)
    assert o.min_duration_s == 3.0 and o.duration_s is None


@pytest.mark.parametrize(
    "min_duration_s, target_qps, samples_per_query, min_query_count",
    [(10.0, 10_000.0, 1, 100), (2.0, 4_000.0, 1, 100), (10.0, 10_000.0, 8, 100),
     (0.0, 5_000.0, 1, 100), (0.5, 20.0, 1, 100), (4.0, 2_500.0, 3, 0)],
)
def test_offline_query_count_is_ceil_of_1_1_times_min_duration_times_qps(
    min_duration_s, target_qps, samples_per_query, min_query_count
):
    o = effective(scenario="offline", min_duration_s=min_duration_s, target_qps=target_qps,
                  samples_per_query=samples_per_query, min_query_count=min_query_count)
    samples = max(min_query_count, math.ceil(1.1 * min_duration_s * target_qps))
    assert o.query_count == max(1, math.ceil(samples / samples_per_query))


def test_offline_defaults_to_10000_expected_qps_and_110000_samples():
    o = effective(scenario="offline")
    assert o.target_qps == 10_000.0
    assert o.query_count == 110_000
    assert get_scenario("offline").engine_settings(o).mode == "offline"


def test_offline_explicit_query_count_wins():
    assert effective(scenario="offline", query_count=7).query_count == 7


def test_offline_query_count_has_no_floating_point_off_by_one():
    o = effective(scenario="offline", min_duration_s=1.0, target_qps=100.0, min_query_count=0)
    exact = math.ceil(Fraction("1.1") * Fraction(1) * Fraction(100))
    assert exact == 110
    assert o.query_count == exact


def test_network_scenarios_default_to_10_s_and_1000_qps_without_mlperf_rules():
    for name in ("constant", "poisson"):
        o = effective(scenario=name)
        assert o.duration_s == 10.0 and o.target_qps == 1000.0
        assert o.min_duration_s == 0.0 and o.min_query_count == 0
        assert o.latency_percentile == 99.0
    o = effective(scenario="concurrency", concurrency=6)
    assert o.duration_s == 10.0
    assert get_scenario("concurrency").engine_settings(o).concurrency == 6
    # A query count alone bounds the run: no default duration then.
    assert effective(scenario="constant", query_count=5).duration_s is None


def test_ramp_and_trace_require_their_inputs():
    with pytest.raises(ValueError, match="--stages is required"):
        effective(scenario="ramp")
    with pytest.raises(ValueError, match="--stages: stage 2"):
        effective(scenario="ramp", stages="1s:10,oops")
    with pytest.raises(ValueError, match="--trace is required"):
        effective(scenario="trace")
    o = effective(scenario="ramp", stages="1s:100-200", ramp="linear")
    assert get_scenario("ramp").engine_settings(o).stages == [(1.0, 100.0, 200.0)]


def test_options_not_made_effective_name_the_unset_option():
    # Engine settings need the defaults Scenario.effective fills in; without them the
    # error names the option rather than failing on None.
    with pytest.raises(ValueError, match="--samples-per-query is unset"):
        get_scenario("constant").engine_settings(RunOptions(scenario="constant"))
    with pytest.raises(ValueError, match="--min-duration-s is unset"):
        get_scenario("server").engine_settings(RunOptions(scenario="server", samples_per_query=1,
                                                          schedule_seed=1, sample_seed=2, spin_us=0.0))


def test_seeds_default_from_the_base_seed():
    o = effective(scenario="constant", seed=41)
    assert o.schedule_seed == 41 and o.sample_seed == 42
    o = effective(scenario="constant", seed=2**64 - 1)
    assert o.sample_seed == 0


def test_prepare_checks_the_sut_before_running():
    with pytest.raises(ValueError, match="not a SUT"):
        prepare(RunOptions(scenario="constant", sut="bogus", duration_s=1.0))
    scenario, o, settings, sut = prepare(RunOptions(scenario="constant", sut="sleep:5", duration_s=1.0))
    assert scenario.name == "constant" and settings.target_qps == 1000.0
    assert type(sut).__name__ == "FixedDelaySUT" and sut.delay_us == 5.0


# -------------------------------------------------------------- precedence merge


def test_defaults_when_nothing_is_given():
    o, given = resolve({}, environ={})
    assert given == {}
    assert o == RunOptions()


def test_precedence_config_then_env_then_flags(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('target-qps = 100\nscenario = "constant"\nduration_s = 2.5\nsut = "null"\n')
    o, given = resolve({"config": str(config)}, environ={})
    assert o.target_qps == 100.0 and o.scenario == "constant" and o.duration_s == 2.5
    assert given["config"] == str(config)

    env = {"LOADGEN_TARGET_QPS": "200", "LOADGEN_SUT": "sleep:10"}
    o, given = resolve({"config": str(config)}, environ=env)
    assert o.target_qps == 200.0 and o.sut == "sleep:10" and o.duration_s == 2.5

    o, given = resolve({"config": str(config), "target_qps": "300"}, environ=env)
    assert o.target_qps == 300.0 and given["target_qps"] == 300.0
    assert o.sut == "sleep:10" and o.scenario == "constant"
    assert set(given) == {"config", "target_qps", "scenario", "duration_s", "sut"}


def test_config_path_from_the_environment(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("concurrency = 3\n")
    o, given = resolve({}, environ={"LOADGEN_CONFIG": str(config)})
    assert o.concurrency == 3 and given["config"] == str(config)


def test_environment_values_are_converted_like_flags():
    o, given = resolve({}, environ={"LOADGEN_QUIET": "yes", "LOADGEN_PIN_CPUS": "0,2-3",
                                    "LOADGEN_FAIL_IF": "p99>5ms; qps<10", "LOADGEN_SEED": "1_000"})
    assert o.quiet is True and o.pin_cpus == [0, 2, 3]
    assert o.fail_if == ["p99>5ms", "qps<10"] and o.seed == 1000


def test_unrelated_environment_variables_are_ignored():
    o, given = resolve({}, environ={"LOADGEN_NOT_AN_OPTION": "1", "TARGET_QPS": "5"})
    assert given == {} and o.target_qps is None


def test_repeatable_flags_collect_every_occurrence():
    o, _ = resolve({"require": ["p99<5ms", "qps>=10;error_rate<1%"]}, environ={})
    assert o.require == ["p99<5ms", "qps>=10", "error_rate<1%"]


@pytest.mark.parametrize(
    "flags, environ, pattern",
    [
        ({"target_qps": "fast"}, {}, r"--target-qps \(flag\): must be a number"),
        ({"target_qps": "0"}, {}, r"--target-qps \(flag\): must be > 0"),
        ({"latency_percentile": "100.5"}, {}, r"--latency-percentile .*must be <= 100"),
        ({"concurrency": "0"}, {}, r"--concurrency .*must be >= 1"),
        ({"scenario": "servr"}, {}, r"--scenario .*must be one of"),
        ({}, {"LOADGEN_TARGET_QPS": "abc"}, r"--target-qps \(environment LOADGEN_TARGET_QPS\)"),
        ({}, {"LOADGEN_QUIET": "maybe"}, r"--quiet .*true or false"),
        ({"pin_cpus": "3-1"}, {}, r"--pin-cpus .*backwards"),
        ({"max_error_rate": "1.5"}, {}, r"--max-error-rate .*<= 1"),
    ],
)
def test_bad_values_name_the_option_and_source(flags, environ, pattern):
    with pytest.raises(OptionError, match=pattern):
        resolve(flags, environ=environ)


def test_config_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("target-qps = [oops\n")
    with pytest.raises(OptionError, match="not valid TOML"):
        resolve({"config": str(bad)}, environ={})
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("target-qsp = 5\n")
    with pytest.raises(OptionError, match="unknown key 'target-qsp'; did you mean 'target-qps'"):
        resolve({"config": str(unknown)}, environ={})
    nested = tmp_path / "nested.toml"
    nested.write_text('config = "other.toml"\n')
    with pytest.raises(OptionError, match="unknown key 'config'"):
        resolve({"config": str(nested)}, environ={})
    typed = tmp_path / "typed.toml"
    typed.write_text('duration-s = "soon"\n')
    with pytest.raises(OptionError, match=r"--duration-s \(config .*typed.toml\)"):
        resolve({"config": str(typed)}, environ={})
    with pytest.raises(OptionError, match="cannot read"):
        resolve({"config": str(tmp_path / "absent.toml")}, environ={})


def test_every_option_has_an_env_name_and_a_flag():
    for spec in OPTION_SPECS:
        assert spec.flag == "--" + spec.name.replace("_", "-")
        assert spec.env == "LOADGEN_" + spec.name.upper()
        assert hasattr(RunOptions(), spec.name)


# ----------------------------------------------------------------------- stages


def test_step_stages_hold_each_rate():
    assert parse_stages("1s:100,1s:500") == [(1.0, 100.0, 100.0), (1.0, 500.0, 500.0)]
    assert parse_stages("500ms:10, 2m:20") == [(0.5, 10.0, 10.0), (120.0, 20.0, 20.0)]


def test_linear_stages_ramp_from_the_previous_rate_starting_at_zero():
    assert parse_stages("1s:100,1s:500", ramp="linear") == [(1.0, 0.0, 100.0), (1.0, 100.0, 500.0)]
    assert parse_stages("2s:300,1s:300", ramp="linear") == [(2.0, 0.0, 300.0), (1.0, 300.0, 300.0)]


def test_explicit_ramps_are_the_same_in_either_mode():
    for ramp in ("step", "linear"):
        assert parse_stages("20s:100-1000", ramp) == [(20.0, 100.0, 1000.0)]
    # A 'D:Q' after an explicit ramp starts from that ramp's end in linear mode.
    assert parse_stages("1s:10-50,1s:70", "linear") == [(1.0, 10.0, 50.0), (1.0, 50.0, 70.0)]
    assert parse_stages("1s:10-50,1s:70", "step") == [(1.0, 10.0, 50.0), (1.0, 70.0, 70.0)]


def test_stages_accept_a_list():
    assert parse_stages(["1s:5", "2s:6"]) == [(1.0, 5.0, 5.0), (2.0, 6.0, 6.0)]


@pytest.mark.parametrize(
    "text, pattern",
    [
        ("", "at least one stage"),
        ("abc", r"stage 1 'abc' must be DURATION:QPS"),
        ("1s:100,abc", r"stage 2 'abc'"),
        ("1s:fast", r"stage 1 .*DURATION:QPS or DURATION:QPS-QPS"),
        ("soon:100", r"stage 1 .*DURATION:QPS"),
        ("1s:100-", r"stage 1"),
        ("0s:100", r"duration must be > 0"),
        ("1s:-5", r"rates must be finite and >= 0"),
        ("1s:inf", r"rates must be finite"),
        ("1s:nan", r"rates must be finite"),
        ("1s:0,2s:0", r"at least one stage needs a rate > 0"),
    ],
)
def test_bad_stages_are_rejected_with_the_stage_named(text, pattern):
    with pytest.raises(ValueError, match=pattern):
        parse_stages(text)


# ---------------------------------------------------------------------- durations


@pytest.mark.parametrize(
    "text, seconds",
    [("10s", 10.0), ("500ms", 0.5), ("2m", 120.0), ("1.5", 1.5), ("1h", 3600.0),
     ("250us", 250e-6), ("100ns", 100e-9), ("1e3ms", 1.0), (" 3 s ", 3.0), (".5s", 0.5), ("0", 0.0)],
)
def test_parse_duration_s(text, seconds):
    assert parse_duration_s(text) == pytest.approx(seconds, rel=1e-12)


@pytest.mark.parametrize("text", ["", "abc", "-1s", "10 sec", "1d", "s", "1.2.3s", "10ss"])
def test_parse_duration_s_rejects_non_durations(text):
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration_s(text)


# --------------------------------------------------------------------- thresholds


@pytest.mark.parametrize(
    "expr, parsed",
    [
        ("p99<5ms", ("p99", "<", 5e6)),
        ("p99.9 <= 250us", ("p99.9", "<=", 250e3)),
        ("p50>1.5s", ("p50", ">", 1.5e9)),
        ("max!=10ns", ("max", "!=", 10.0)),
        ("mean == 2e3us", ("mean", "==", 2e6)),
        ("issue_delay_p99>1ms", ("issue_delay_p99", ">", 1e6)),
        ("service_p99<3ms", ("service_p99", "<", 3e6)),
        ("error_rate>1%", ("error_rate", ">", 0.01)),
        ("error_rate>0.02", ("error_rate", ">", 0.02)),
        ("qps>=1000", ("qps", ">=", 1000.0)),
        ("samples_per_s>=8e3", ("samples_per_s", ">=", 8000.0)),
        ("failed>0", ("failed", ">", 0.0)),
        ("timed_out<=3", ("timed_out", "<=", 3.0)),
    ],
)
def test_parse_threshold_converts_units_to_the_metric_base(expr, parsed):
    metric, op, value = parse_threshold(expr)
    assert (metric, op) == parsed[:2]
    assert value == pytest.approx(parsed[2], rel=1e-12)


@pytest.mark.parametrize(
    "expr, pattern",
    [
        ("p99>>1ms", "is not METRIC OP VALUE"),
        ("p99", "is not METRIC OP VALUE"),
        ("p99<fast", "is not METRIC OP VALUE"),
        ("p99<5min", "is not METRIC OP VALUE"),
        ("p99<5", "p99 is a latency; give a unit"),
        ("p99<5%", "p99 is a latency; give a unit"),
        ("qps>5ms", "qps takes no unit"),
        ("qps>5%", "qps takes no unit"),
        ("error_rate>1ms", "error_rate takes no unit but %"),
        ("p999<1ms", "unknown metric 'p999'; did you mean p99.9"),
        ("latncy_p99<1ms", "unknown metric"),
        ("zzzz<1", "use one of"),
    ],
)
def test_bad_thresholds_say_what_is_wrong(expr, pattern):
    with pytest.raises(ThresholdError, match=pattern):
        parse_threshold(expr)


def fake_doc(**counts):
    c = {"issued": 200, "completed": 190, "failed": 6, "timed_out": 4, "cancelled": 0}
    c.update(counts)
    lat = {"p50": 1e6, "p90": 2e6, "p95": 3e6, "p99": 4e6, "p99.9": 5e6, "p99.99": 6e6,
           "mean": 1.2e6, "max": 7e6, "min": 1e5}
    return {
        "counts": c,
        "latency_ns": lat,
        "issue_delay_ns": {"p99": 50_000.0},
        "service_time_ns": {"p99": 3.5e6},
        "throughput": {"completed_qps": 950.0, "samples_per_s": 7600.0},
    }


def test_evaluate_thresholds_fail_if_and_require():
    doc = fake_doc()
    out = evaluate_thresholds(doc, ["p99>3ms", "p50>3ms", "error_rate>4%"],
                              ["qps>=1000", "service_p99<4ms", "issue_delay_p99<=50us"])
    by_expr = {t["expr"]: t for t in out}
    assert [t["kind"] for t in out] == ["fail_if"] * 3 + ["require"] * 3
    assert by_expr["p99>3ms"]["passed"] is False and by_expr["p99>3ms"]["actual"] == 4e6
    assert by_expr["p50>3ms"]["passed"] is True
    # (6 failed + 4 timed out) / 200 issued = 5% > 4%: fails.
    assert by_expr["error_rate>4%"]["actual"] == pytest.approx(0.05)
    assert by_expr["error_rate>4%"]["passed"] is False
    assert by_expr["qps>=1000"]["passed"] is False and by_expr["qps>=1000"]["actual"] == 950.0
    assert by_expr["service_p99<4ms"]["passed"] is True
    assert by_expr["issue_delay_p99<=50us"]["passed"] is True
    for t in out:
        assert set(t) == {"kind", "expr", "metric", "actual", "threshold", "passed"}


def test_error_rate_of_a_run_with_nothing_issued_is_zero():
    doc = fake_doc(issued=0, completed=0, failed=0, timed_out=0)
    (t,) = evaluate_thresholds(doc, ["error_rate>0"], [])
    assert t["actual"] == 0.0 and t["passed"] is True


def test_every_threshold_metric_can_be_evaluated():
    doc = fake_doc()
    for metric in THRESHOLD_METRICS:
        is_latency = metric not in ("qps", "samples_per_s", "error_rate", "failed", "timed_out",
                                  "goodput", "goodput_fraction")
        expr = f"{metric}>=0" + ("ns" if is_latency else "")
        (t,) = evaluate_thresholds(doc, [], [expr])
        assert t["passed"] is True, expr


# ------------------------------------------------------------ run_benchmark in process


def test_run_benchmark_constant_null_gives_a_complete_document():
    options, given = resolve({"scenario": "constant", "sut": "null", "target_qps": "1000",
                              "duration_s": "0.3", "interval_s": "0.1",
                              "max_issue_delay_ms": "100", "require": ["qps>0"]}, environ={})
    doc = run_benchmark(options, given=given)
    c = doc["counts"]
    assert doc["schema"] == "loadgen.result/1" and doc["scenario"] == "constant"
    # A constant schedule at 1000 qps for 0.3 s holds 300 arrivals (bounds follow the
    # schedule, not the clock), give or take the one at the boundary.
    assert abs(c["issued"] - 300) <= 1
    assert c["issued"] == c["completed"] + c["failed"] + c["timed_out"] + c["cancelled"]
    assert doc["valid"], doc["invalid_reasons"]
    assert doc["settings"]["given"]["target_qps"] == 1000.0
    assert doc["settings"]["effective"]["duration_s"] == 0.3
    assert doc["settings"]["engine"]["mode"] == "constant"
    assert len(doc["timeseries"]) >= 3
    assert sum(p["issued"] for p in doc["timeseries"]) == c["issued"]
    assert doc["thresholds"] == [{"kind": "require", "expr": "qps>0", "metric": "qps",
                                  "actual": doc["throughput"]["completed_qps"], "threshold": 0.0,
                                  "passed": True}]
    assert "early_stopping" not in doc


def test_run_benchmark_stop_requested_marks_the_run_interrupted_and_invalid():
    options = RunOptions(scenario="constant", sut="null", target_qps=200.0, duration_s=30.0)
    polls = []

    def stop():
        polls.append(1)
        return len(polls) > 2  # after ~0.2 s

    doc = run_benchmark(options, stop_requested=stop)
    c = doc["counts"]
    assert doc["interrupted"] is True and doc["valid"] is False
    assert any("interrupted" in r for r in doc["invalid_reasons"])
    # Stopped long before the 30 s (6000 queries) it was asked for.
    assert 0 < c["issued"] < 2000 and doc["duration_s"] < 10
    assert c["issued"] == c["completed"] + c["failed"] + c["timed_out"] + c["cancelled"]


def test_run_benchmark_reports_progress():
    seen = []
    options = RunOptions(scenario="constant", sut="null", target_qps=500.0, duration_s=0.6)
    run_benchmark(options, on_progress=seen.append, progress_interval_s=0.1)
    assert seen, "no progress reported"
    assert all(p.issued >= p.completed >= 0 for p in seen)
    assert seen[-1].elapsed_s > seen[0].elapsed_s


def test_run_benchmark_single_stream_metric_and_early_stopping():
    options = RunOptions(scenario="single-stream", sut="sleep:200", min_duration_s=0.2,
                         min_query_count=80, max_issue_delay_ms=100.0)
    doc = run_benchmark(options)
    assert doc["metric"]["name"] == "p90_latency" and doc["metric"]["unit"] == "ms"
    assert doc["metric"]["value"] == doc["latency_ns"]["p90"] / 1e6
    assert doc["counts"]["issued"] >= 80
    es = doc["early_stopping"]
    assert es["passed"] and es["percentile"] == 90.0 and es["min_queries"] == 64
    assert es["queries"] == doc["counts"]["completed"]
