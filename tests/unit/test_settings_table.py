"""Each setting is declared once: ``loadgen run``'s option table (loadgen.options.OPTION_SPECS)
holds its default and unit, RunOptions' fields and the help text are made from it, and the
structures that carry settings on (NetOptions, LlmOptions, EngineSettings and the native
settings) agree with it."""

from __future__ import annotations

import dataclasses
import re

import pytest

from loadgen import _core, defaults
from loadgen.engine.settings import CORE_ONLY_FIELDS, MODE_FIELDS, EngineSettings
from loadgen.llm import LlmOptions
from loadgen.net import net_options
from loadgen.net.openai_stream import OpenAISUT
from loadgen.net.options import NetOptions
from loadgen.net.targets import parse_target
from loadgen.options import DEFAULT_MARK, OPTION_SPECS, RunOptions, format_default
from loadgen.units import TIME_UNITS

SPECS = {spec.name: spec for spec in OPTION_SPECS}


def _field_default(f: dataclasses.Field):
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _shown(default) -> bool:
    """Whether the help names a default: not None (the scenario decides), not off, not empty."""
    return default is not None and default is not False and default != []


# ------------------------------------------------------------------- the option table


def test_every_run_options_field_is_an_option_and_takes_its_default():
    fields = {f.name: f for f in dataclasses.fields(RunOptions)}
    assert sorted(fields) == sorted(SPECS)
    for name, f in fields.items():
        assert _field_default(f) == SPECS[name].default, name


def test_a_list_default_is_fresh_for_every_run_options():
    a, b = RunOptions(), RunOptions()
    a.header.append("X-Test: 1")
    assert b.header == [] and SPECS["header"].default == []


def test_every_default_is_a_value_its_option_accepts_unchanged():
    for spec in OPTION_SPECS:
        if spec.default is None:
            continue
        assert spec.convert(spec.default) == spec.default, spec.name


def test_the_help_names_the_default_the_table_holds():
    for spec in OPTION_SPECS:
        assert DEFAULT_MARK not in spec.help, spec.name
        if not _shown(spec.default):
            continue
        assert DEFAULT_MARK in spec.help_text, f"{spec.flag}: its help does not say its default"
        text = format_default(spec.default)
        assert re.search(rf"default:? {re.escape(text)}\b|{re.escape(text)} \(default", spec.help), spec.help


def test_the_help_default_follows_the_table():
    spec = dataclasses.replace(SPECS["grace_s"], default=2.5)
    assert "(default 2.5)" in spec.help and "(default 10)" in SPECS["grace_s"].help


def test_a_time_option_carries_the_unit_its_name_ends_in():
    for spec in OPTION_SPECS:
        suffix = spec.name.rpartition("_")[2]
        if suffix in TIME_UNITS:
            assert spec.unit == suffix, spec.name
    assert SPECS["target_qps"].unit == "queries/s" and SPECS["seed"].unit == ""


# ------------------------------------------------------- the structures settings reach


def _defaults_of(cls) -> dict:
    return {f.name: _field_default(f) for f in dataclasses.fields(cls)}


def _same(a, b) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(a) == list(b)
    return a == b


# Fields of the same meaning under another name (or inverted): name -> (RunOptions field, mapping).
_RENAMED = {
    "headers": ("header", list), "secret_headers": ("secret_header", list), "inputs": ("input", list),
    "check_responses": ("no_response_check", lambda v: not v), "stream": ("no_stream", lambda v: not v),
}


@pytest.mark.parametrize("cls", [NetOptions, LlmOptions, EngineSettings])
def test_shared_defaults_agree_with_run_options(cls):
    run = _defaults_of(RunOptions)
    checked = 0
    for name, default in _defaults_of(cls).items():
        if cls is LlmOptions and name == "seed":  # the sample seed: --sample-seed, made from --seed
            assert default == defaults.sample_seed_of(run["seed"]) == 1
            continue
        if name in _RENAMED:
            other, mapping = _RENAMED[name]
            assert _same(default, mapping(run[other])), name
        elif name in run and run[name] is not None:  # None: the scenario decides
            assert _same(default, run[name]), f"{cls.__name__}.{name}: {default!r}, the option's {run[name]!r}"
        else:
            continue
        checked += 1
    assert checked >= 8


def test_a_default_run_builds_the_default_net_and_llm_options():
    net = net_options(RunOptions())
    bare = NetOptions()
    for f in dataclasses.fields(NetOptions):
        if f.name not in ("llm", "secret_values"):
            assert _same(getattr(net, f.name), getattr(bare, f.name)), f.name
    assert net.llm == LlmOptions()


def test_an_openai_target_without_llm_options_draws_with_the_cli_sample_seed():
    # A NetOptions built in Python (no llm) draws its prompts with the seed a CLI run uses.
    sut = OpenAISUT(parse_target("openai+http://127.0.0.1:1/v1/completions"), NetOptions(seed=41), 1)
    assert sut.llm_options().seed == 42
    assert sut.llm_options() == net_options(RunOptions(seed=41, sut="openai+http://127.0.0.1:1/v1/completions")).llm


# ----------------------------------------------------------------- the native settings


_NATIVE_SETTINGS = _core.EngineSettings


class _Recorder:
    """A native EngineSettings that notes every field assigned to it."""

    def __init__(self) -> None:
        object.__setattr__(self, "real", _NATIVE_SETTINGS())
        object.__setattr__(self, "assigned", set())

    def __setattr__(self, name, value):
        self.assigned.add(name)
        setattr(self.real, name, value)

    def __getattr__(self, name):
        return getattr(self.real, name)


def _native_fields() -> set:
    return {n for n in dir(_NATIVE_SETTINGS()) if not n.startswith("_")}


_RUNS = [
    (EngineSettings(mode="closed", concurrency=2, duration_s=1.0), "function"),
    (EngineSettings(mode="constant", target_qps=10.0, query_count=5), "null"),
    (EngineSettings(mode="poisson", target_qps=10.0, duration_s=1.0, timeout_ms=5.0), "batched"),
    (EngineSettings(mode="stages", stages=[(1.0, 1.0, 2.0)]), "function"),
    (EngineSettings(mode="trace", trace_offsets_ns=[0, 1000]), "null"),
    (EngineSettings(mode="offline", query_count=3), "function"),
]


@pytest.mark.parametrize("settings, sut_form", _RUNS, ids=[s.mode for s, _ in _RUNS])
def test_every_native_field_a_run_reads_is_set_from_python(monkeypatch, settings, sut_form):
    monkeypatch.setattr(_core, "EngineSettings", _Recorder)
    native = settings.to_core(sut_form, None)
    left = _native_fields() - native.assigned
    assert not native.assigned & set(CORE_ONLY_FIELDS)
    assert left <= set(CORE_ONLY_FIELDS) | set(MODE_FIELDS), f"left to the core's defaults: {sorted(left)}"
    assert ("concurrency" in native.assigned) == (settings.mode == "closed")
    assert ("arrival" in native.assigned) == (settings.mode != "closed")


def test_the_lists_of_fields_left_to_the_core_name_native_fields():
    native = _native_fields()
    assert set(CORE_ONLY_FIELDS) <= native and set(MODE_FIELDS) <= native
    assert all(CORE_ONLY_FIELDS.values()) and all(MODE_FIELDS.values())


def test_native_values_come_from_the_defaults_module():
    native = EngineSettings(mode="closed", duration_s=1.0).to_core("function", None)
    assert native.highest_trackable_ns == defaults.HIGHEST_LATENCY_NS
    assert native.max_error_messages == defaults.MAX_ERROR_MESSAGES
    assert native.spin_ns == defaults.SPIN_US * 1000 and native.grace_ns == defaults.GRACE_S * 1e9
