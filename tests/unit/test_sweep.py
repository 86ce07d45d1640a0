"""``loadgen sweep``: parsing a grid or a list of points (unit), and real sweeps as a CLI
subprocess against the demo SUT, the scripted server and a real MLServer: folders and
tables, pandas, resuming after Ctrl-C, a changed configuration refused, hooks (their
environment, failures, timeouts, --stop-on-error), repeats and a shuffled order.

Points are short (0.1-0.4 s) and every subprocess is bounded by a timeout.

The tests that start processes or servers are in tests/integration/test_sweep.py.
"""

from __future__ import annotations

from typing import Any, Dict, List

import pytest

from loadgen.options import OptionError, read_config_table, resolve
from loadgen.sweep.grid import (
    Dimension,
    SweepError,
    combine,
    parse_values,
    parse_vary,
    point_slug,
    read_points_file,
)
from loadgen.sweep.plan import plan_runs, point_key
from loadgen.sweep.run import eta_s
from loadgen.sweep.settings import SweepSettings, split_table, sweep_settings

# ------------------------------------------------------------------- grid (unit)

def test_values_are_comma_lists_with_inclusive_ranges():
    assert parse_values("1,2,4:16:4") == ["1", "2", 4, 8, 12, 16]  # text until the option converts it
    assert parse_vary("concurrency=1,2,4:16:4").values == (1, 2, 4, 8, 12, 16)
    assert parse_values("100:1000:100") == list(range(100, 1001, 100))
    assert parse_values("0.1:0.3:0.1") == [0.1, 0.2, 0.3]  # decimal steps: no 0.30000000000000004
    assert parse_values("8:2:-3") == [8, 5, 2]
    assert parse_values("a, b") == ["a", "b"]
    for bad, words in (("1:5:0", "never reaches"), ("5:1:1", "never reaches"), ("1,,2", "empty value")):
        with pytest.raises(SweepError, match=words):
            parse_values(bad)


def test_vary_names_take_dashes_or_underscores_and_values_use_the_options_converter():
    assert parse_vary("target-qps=100:300:100") == Dimension("target_qps", (100.0, 200.0, 300.0))
    assert parse_vary("target_qps=5") == Dimension("target_qps", (5.0,))
    assert parse_vary("label.config=a,b") == Dimension("label.config", ("a", "b"))
    assert parse_vary("inline-dispatch=true,false").values == (True, False)
    cases = [
        ("concurrency=1,x", "--vary concurrency: --concurrency must be an integer, got 'x'"),
        ("concurrency=0", "--concurrency must be >= 1"),
        ("concurency=1", "did you mean concurrency"),
        ("label=a,b", "label.config=a,b"),
        ("output=a", "cannot be swept"),
        ("config=a.toml", "cannot be swept"),
        ("label.9x=a", "label name '9x'"),
        ("concurrency=1,1", "given twice"),
        ("concurrency", "NAME=VALUES"),
        ("scenario=server,bogus", "--scenario must be one of"),
    ]
    for text, message in cases:
        with pytest.raises(SweepError) as e:
            parse_vary(text)
        assert message in str(e.value), (text, str(e.value))


def test_a_grid_is_the_cartesian_product_and_listed_points_combine_with_it():
    dims = [parse_vary("concurrency=1,2"), parse_vary("label.config=a,b")]
    assert combine(dims, None) == [
        {"concurrency": 1, "label.config": "a"}, {"concurrency": 1, "label.config": "b"},
        {"concurrency": 2, "label.config": "a"}, {"concurrency": 2, "label.config": "b"}]
    points = [{"seed": 1}, {"seed": 2}]
    assert combine(dims[:1], points) == [{"seed": 1, "concurrency": 1}, {"seed": 1, "concurrency": 2},
                                         {"seed": 2, "concurrency": 1}, {"seed": 2, "concurrency": 2}]
    assert combine([], points) == points
    with pytest.raises(SweepError, match="both varied"):
        combine(dims, [{"concurrency": 3}])
    with pytest.raises(SweepError, match="given twice"):
        combine([dims[0], dims[0]], None)
    with pytest.raises(SweepError, match="more than"):
        combine([parse_vary("seed=1:400:1"), parse_vary("concurrency=1:400:1")], None)


def test_the_sweep_table_holds_a_grid_points_and_settings(tmp_path):
    config = tmp_path / "sweep.toml"
    config.write_text('scenario = "concurrency"\nduration-s = 0.5\n\n[sweep]\n'
                      'vary = {concurrency = [1, 2], label.config = ["a", "b"], seed = "1:3:1"}\n'
                      'points = [{max-in-flight = 0}, {sample-order = "sequential"}]\n'
                      'repeat = 2\nbefore-point = "true"\n')
    table = read_config_table(str(config), "sweep")
    dims, points, raw = split_table(table, "[sweep]")
    assert dims == [Dimension("concurrency", (1, 2)), Dimension("label.config", ("a", "b")),
                    Dimension("seed", (1, 2, 3))]
    assert points == [{"max_in_flight": 0}, {"sample_order": "sequential"}]
    settings = sweep_settings({"repeat": "3"}, raw, "[sweep]")
    assert (settings.repeat, settings.before_point) == (3, "true")  # the flag wins over the table
    # `run` refuses the table, `sweep` reads its options around it
    with pytest.raises(OptionError, match=r"\[sweep\] table is read by 'loadgen sweep'"):
        resolve({"config": str(config)}, environ={})
    options, _ = resolve({"config": str(config)}, environ={}, config_tables=("sweep",))
    assert (options.scenario, options.duration_s) == ("concurrency", 0.5)
    for bad, message in (({"vary": {"concurrency": ["x"]}}, "--concurrency must be an integer"),
                         ({"vry": {}}, "did you mean 'vary'"), ({"points": [1]}, "list of tables"),
                         ({"points": [{}]}, "sets no option")):
        with pytest.raises(SweepError, match=message):
            split_table(bad, "[sweep]")
    with pytest.raises(SweepError, match="--repeat"):
        sweep_settings({"repeat": "0"}, {}, "[sweep]")


def test_points_files_are_toml_json_or_json_lines(tmp_path):
    (tmp_path / "p.toml").write_text('points = [{concurrency = 1}, {concurrency = 2, label.config = "x"}]\n')
    (tmp_path / "p.json").write_text('[{"concurrency": 1}, {"concurrency": 2, "label.config": "x"}]')
    (tmp_path / "p.jsonl").write_text('{"concurrency": 1}\n{"concurrency": 2, "label.config": "x"}\n')
    for name in ("p.toml", "p.json", "p.jsonl"):
        assert read_points_file(str(tmp_path / name)) == [{"concurrency": 1},
                                                          {"concurrency": 2, "label.config": "x"}], name
    (tmp_path / "bad.json").write_text('[{"concurrency": -1}]')
    with pytest.raises(SweepError, match="point 0: concurrency: --concurrency must be >= 1"):
        read_points_file(str(tmp_path / "bad.json"))
    with pytest.raises(SweepError, match="cannot read"):
        read_points_file(str(tmp_path / "missing.json"))


def test_slugs_are_short_and_safe():
    assert point_slug({"concurrency": 4, "label.config": "a"}) == "concurrency-4_config-a"
    assert point_slug({"target_qps": 100.0, "sut": "http://h:1/v2/models/m/infer"}).startswith("target_qps-100_sut-http-h-1")
    long = point_slug({"label.x": "y" * 200})
    assert len(long) <= 60 and long != point_slug({"label.x": "y" * 201})


# -------------------------------------------------------------------- plan (unit)

def _plan(values: List[Dict[str, Any]], **settings: Any):
    return plan_runs({"scenario": "concurrency", "duration_s": "0.5"}, values, SweepSettings(**settings), environ={})


def test_every_point_is_resolved_and_checked_before_anything_runs():
    points = [{"concurrency": c} for c in (1, 2)] + [{"sut": "sleep:x"}]
    with pytest.raises(SweepError, match=r"point 2 \(sut=sleep:x\): --sut sleep:x: sleep needs a delay"):
        _plan(points)
    with pytest.raises(SweepError, match="points 0 and 1"):
        _plan([{"concurrency": 1}, {"seed": 0}])  # both are the base options


def test_keys_are_stable_and_leave_out_where_results_go():
    base, runs, _ = _plan([{"concurrency": 1}, {"concurrency": 2}])
    again = _plan([{"concurrency": 2}, {"concurrency": 1}])[1]
    assert {r.key for r in runs} == {r.key for r in again}
    moved = plan_runs({"scenario": "concurrency", "duration_s": "0.5", "output": "elsewhere", "quiet": True},
                      [{"concurrency": 1}], SweepSettings(), environ={})[1]
    assert moved[0].key == runs[0].key
    assert point_key(runs[0].options, 1) != runs[0].key
    assert runs[0].planned_s == 0.5 and eta_s(runs, []) == 1.0 and eta_s(runs, [2.0]) == 4.0


def test_repeats_run_in_rounds_and_a_shuffled_order_is_reproducible_by_seed():
    points = [{"concurrency": c} for c in (1, 2, 3)]
    _, runs, _ = _plan(points, repeat=2)
    assert [(r.index, r.repeat) for r in runs] == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]
    assert runs[3].dir.endswith("-r1") and not runs[0].dir.endswith("-r0")
    orders = {seed: [(r.index, r.repeat) for r in _plan(points, repeat=2, order="shuffled", order_seed=seed)[1]]
              for seed in (1, 2, 3)}
    assert orders[1] == [(r.index, r.repeat) for r in _plan(points, repeat=2, order="shuffled", order_seed=1)[1]]
    assert len({tuple(o) for o in orders.values()}) > 1  # 720 orders: three seeds giving one would be a bug
    assert all(sorted(o) == sorted(orders[1]) for o in orders.values())


# ------------------------------------------------------------- the CLI (integration)


def test_each_repeat_runs_with_its_own_seed_derived_from_seed_and_the_repeat():
    from loadgen.runner import plan
    from loadgen.workers import splitmix64

    def seeds(flags: Dict[str, Any], repeat: int = 3):
        runs = plan_runs({"scenario": "poisson", "duration_s": "0.5", **flags}, [{"target_qps": 100}],
                         SweepSettings(repeat=repeat), environ={})[1]
        return [(r.repeat, r.options.seed, plan(r.options)[1].schedule_seed, plan(r.options)[1].sample_seed)
                for r in runs]

    runs = seeds({"seed": "7"})
    # Repeat 0 runs what `loadgen run --seed 7` would; every other repeat has its own seeds.
    assert runs[0] == (0, 7, 7, 8)
    assert runs[1][1] == splitmix64(splitmix64(7) ^ (2**62 + 1))
    assert len({r[1] for r in runs}) == len({r[2] for r in runs}) == len({r[3] for r in runs}) == 3
    assert all(sample == (seed + 1) % 2**64 and schedule == seed for _, seed, schedule, sample in runs)
    assert seeds({"seed": "7"}) == runs  # reproducible
    assert {r[1] for r in seeds({"seed": "8"})[1:]}.isdisjoint(r[1] for r in runs)
    # The keys, which a resumed sweep matches, are those of the point's options and repeat.
    planned = plan_runs({"scenario": "poisson", "duration_s": "0.5", "seed": "7"}, [{"target_qps": 100}],
                        SweepSettings(repeat=2), environ={})[1]
    assert planned[1].key == point_key(planned[0].options, 1)
    # Seeds the user pinned for the sweep are shared by its repeats.
    pinned = seeds({"seed": "7", "schedule_seed": "5", "sample_seed": "6"})
    assert {(r[2], r[3]) for r in pinned} == {(5, 6)}


# ------------------------------------------------------------ scaled-out sweeps

def test_workers_give_a_point_the_same_key_and_start_points_in_lockstep():
    from loadgen.sweep.run import start_times

    def runs(index):
        flags = {"scenario": "poisson", "duration_s": "0.5", "target_qps": "100", "workers": "2",
                 "worker_index": str(index), "start_at": "1000"}
        return plan_runs(flags, [{"warmup_s": 0.0}, {"warmup_s": 0.5}], SweepSettings(), environ={})[1]

    w0, w1 = runs(0), runs(1)
    assert [r.key for r in w0] == [r.key for r in w1]  # merge matches the points by key
    assert [r.options.start_at for r in start_times(w0, 2.0)] == [1000.0, 1002.5]  # 0.5 s + 2 s gap
    with pytest.raises(SweepError, match="needs a known length"):
        plan_runs({"scenario": "poisson", "query_count": "10", "start_at": "1000"}, [{"seed": 1}],
                  SweepSettings(), environ={})


