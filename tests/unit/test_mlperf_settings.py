"""loadgen.mlperf.settings against the MLPerf LoadGen Python module (mlperf_loadgen).

mlperf_loadgen is the oracle wherever it can answer in-process: attribute names,
defaults and assignment rules; FromConfig on handwritten and generated configuration
files and on the built-in mlperf.conf; the requested_* / effective_* entries of the
detail log of short real runs. Effective settings are also checked against numbers
worked out by hand from the normalisation rules.

mlperf_loadgen loads its built-in configuration only on the first conf_type=1 call in
a process, so in-process comparisons call it with conf_type 0 and 2 only; the
conf_type=1 behaviour is compared in a fresh subprocess.

The tests that start processes or servers are in tests/integration/test_mlperf_settings.py.
"""

from __future__ import annotations

import copy
import fractions
import json
import math
import pickle
import random
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from loadgen.mlperf import config_file as CF
from loadgen.mlperf import detail_items as DI
from loadgen.mlperf import effective as E
from loadgen.mlperf import settings as S

lg = pytest.importorskip("mlperf_loadgen")

SC = S.TestScenario
MO = S.TestMode
SCENARIOS = ("SingleStream", "MultiStream", "Server", "Offline")
U64 = (1 << 64) - 1
SDIST_CONF = Path("/tmp/mlsrc/mlcommons_loadgen-6.0.17/mlperf.conf")


@pytest.fixture(autouse=True)
def _fresh_config_state():
    CF.reset_config_state()
    yield
    CF.reset_config_state()


# ------------------------------------------------------------------------ helpers


def lg_fields(obj) -> list[str]:
    return sorted(a for a in dir(obj) if not a.startswith("__") and a != "FromConfig")


def same_value(ref, mine) -> bool:
    """Equal value and kind; enums by name and number, NaN equal to NaN."""
    if hasattr(ref, "name") and hasattr(ref, "value") and not isinstance(ref, bool):
        return (
            isinstance(mine, S._PybindLikeEnum)
            and ref.name == mine.name
            and int(ref) == int(mine)
        )
    if type(ref) is not type(mine):
        return False
    if isinstance(ref, float) and math.isnan(ref):
        return math.isnan(mine)
    return ref == mine


def diff_settings(ref, mine) -> list[tuple[str, object, object]]:
    return [
        (name, getattr(ref, name), getattr(mine, name))
        for name in S.TEST_SETTINGS_FIELDS
        if not same_value(getattr(ref, name), getattr(mine, name))
    ]


def to_lg_value(value):
    if isinstance(value, S._PybindLikeEnum):
        return getattr(getattr(lg, type(value).__name__), value.name)
    return value


def settings_pair(**fields):
    ref, mine = lg.TestSettings(), S.TestSettings()
    for name, value in fields.items():
        setattr(ref, name, to_lg_value(value))
        setattr(mine, name, value)
    return ref, mine


def write(path: Path, text: str) -> str:
    path.write_bytes(text.encode("latin-1"))
    return str(path)


# -------------------------------------------------------------------------- enums


@pytest.mark.parametrize("name", ["TestScenario", "TestMode", "LoggingMode"])
def test_enum_members_match(name):
    ref, mine = getattr(lg, name), getattr(S, name)
    assert {k: int(v) for k, v in ref.__members__.items()} == {
        k: int(v) for k, v in mine.__members__.items()
    }
    for member_name, ref_member in ref.__members__.items():
        member = mine[member_name]
        assert member.name == ref_member.name and member.value == ref_member.value
        assert str(member) == str(ref_member)
        assert repr(member) == repr(ref_member)
        assert f"{member}" == f"{ref_member}"
        assert mine(int(ref_member)) is member


# ----------------------------------------------------- attributes and defaults


@pytest.mark.parametrize(
    "ref_cls, mine_cls",
    [
        (lg.TestSettings, S.TestSettings),
        (lg.LogOutputSettings, S.LogOutputSettings),
        (lg.LogSettings, S.LogSettings),
    ],
)
def test_attribute_names_and_defaults(ref_cls, mine_cls):
    ref, mine = ref_cls(), mine_cls()
    assert lg_fields(ref) == sorted(mine_cls.__slots__)
    for name in mine_cls.__slots__:
        ref_value, value = getattr(ref, name), getattr(mine, name)
        if name == "enable_trace":
            # The one deliberate difference: no trace file unless asked for (and
            # asking for one raises NotImplementedError at StartTest).
            assert ref_value is True and value is False
        elif name == "log_output":
            for sub in S.LOG_OUTPUT_SETTINGS_FIELDS:
                assert same_value(getattr(ref_value, sub), getattr(value, sub)), sub
        else:
            assert same_value(ref_value, value), (name, ref_value, value)


def test_field_constants():
    assert S.TEST_SETTINGS_FIELDS[:2] == ("scenario", "mode")
    assert "ttft_latency" in S.TEST_SETTINGS_FIELDS
    assert "server_ttft_latency" not in S.TEST_SETTINGS_FIELDS
    assert len(S.TEST_SETTINGS_FIELDS) == 42
    assert S.LOG_SETTINGS_FIELDS == (
        "log_output",
        "log_mode",
        "log_mode_async_poll_interval_ms",
        "enable_trace",
    )


class _IndexOnly:
    def __index__(self):
        return 5


class _FloatOnly:
    def __float__(self):
        return 2.5


class _IntOnly:
    def __int__(self):
        return 7


class _BoolOnly:
    def __bool__(self):
        return True


ASSIGNED_VALUES = [
    0, 1, -1, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**63, U64, U64 + 1, 10**400,
    1.5, 2.0, -0.5, math.nan, math.inf, True, False, None, "1", b"1", [1], 1 + 2j,
    np.int64(3), np.uint64(U64), np.float64(2.5), np.float32(2.5), np.bool_(True),
    np.array([3]), np.array([1, 2]), _IndexOnly(), _FloatOnly(), _IntOnly(),
    _BoolOnly(), fractions.Fraction(1, 2), Decimal("1.5"), Decimal("nan"),
]  # fmt: skip
ENUM_VALUES = [(getattr(lg, e.__name__)(1), e(1)) for e in (SC, MO, S.LoggingMode)]


def _assign(obj, name, value):
    try:
        setattr(obj, name, value)
    except TypeError:
        return ("TypeError",)
    return ("ok", getattr(obj, name))


@pytest.mark.parametrize(
    "ref_cls, mine_cls",
    [
        (lg.TestSettings, S.TestSettings),
        (lg.LogOutputSettings, S.LogOutputSettings),
        (lg.LogSettings, S.LogSettings),
    ],
)
def test_assignment_rules_match(ref_cls, mine_cls):
    mismatches = []
    for name in mine_cls.__slots__:
        for value in ASSIGNED_VALUES + ENUM_VALUES:
            ref_value, my_value = value if isinstance(value, tuple) else (value, value)
            ref_result = _assign(ref_cls(), name, ref_value)
            my_result = _assign(mine_cls(), name, my_value)
            if ref_result[0] != my_result[0] or (
                ref_result[0] == "ok"
                and name != "log_output"
                and not same_value(ref_result[1], my_result[1])
            ):
                mismatches.append((name, repr(value)[:40], ref_result, my_result))
    assert mismatches == []


def test_type_error_names_the_field():
    ts = S.TestSettings()
    with pytest.raises(TypeError, match=r"TestSettings\.min_duration_ms"):
        ts.min_duration_ms = 1.5
    with pytest.raises(TypeError, match=r"TestSettings\.scenario"):
        ts.scenario = 3
    with pytest.raises(TypeError, match=r"TestSettings\.mode"):
        ts.mode = SC.Offline
    with pytest.raises(TypeError, match=r"TestSettings\.print_timestamps"):
        ts.print_timestamps = "yes"
    with pytest.raises(TypeError, match=r"LogOutputSettings\.outdir"):
        S.LogOutputSettings().outdir = 1
    with pytest.raises(TypeError, match=r"LogSettings\.log_output"):
        S.LogSettings().log_output = None


def test_int_for_float_and_unknown_attributes():
    ts = S.TestSettings()
    ts.server_target_qps = 5
    assert ts.server_target_qps == 5.0 and type(ts.server_target_qps) is float
    ts.min_duration_ms = True
    assert ts.min_duration_ms == 1 and type(ts.min_duration_ms) is int
    with pytest.raises(AttributeError):
        ts.server_ttft_latency = 1
    with pytest.raises(AttributeError):
        ts.min_duration = 1
    with pytest.raises(AttributeError):
        del ts.mode
    with pytest.raises(AttributeError):
        lg.TestSettings().min_duration = 1
    assert not hasattr(ts, "__dict__")


def test_keyword_construction():
    ts = S.TestSettings(scenario=SC.Offline, offline_expected_qps=10)
    assert ts.scenario is SC.Offline and ts.offline_expected_qps == 10.0
    with pytest.raises(TypeError):
        S.TestSettings(min_query_count=-1)
    with pytest.raises(AttributeError):
        S.TestSettings(bogus=1)


def test_log_output_assignment_copies_like_lg():
    for module in (lg, S):
        log = module.LogSettings()
        log.log_output.outdir = "in_place"
        assert log.log_output.outdir == "in_place"
        out = module.LogOutputSettings()
        out.outdir = "assigned"
        log.log_output = out
        out.outdir = "changed_later"
        assert log.log_output.outdir == "assigned"


def test_copy_equality_repr_pickle():
    ts = S.TestSettings(scenario=SC.Server, server_target_qps=12.5, qsl_rng_seed=U64)
    duplicates = [ts.copy(), copy.copy(ts), copy.deepcopy(ts)]
    duplicates.append(pickle.loads(pickle.dumps(ts)))
    for duplicate in duplicates:
        assert duplicate == ts and duplicate is not ts
        assert duplicate.scenario is SC.Server
    other = ts.copy()
    other.min_query_count = 1
    assert other != ts and ts.min_query_count == 100
    text = repr(ts)
    assert text.startswith("TestSettings(scenario=TestScenario.Server, ")
    assert "server_target_qps=12.5" in text and f"qsl_rng_seed={U64}" in text

    log = S.LogSettings()
    log_copy = copy.deepcopy(log)
    log_copy.log_output.outdir = "elsewhere"
    assert log.log_output.outdir == "."
    assert "LogOutputSettings(outdir='.'" in repr(log)
    assert "log_mode=LoggingMode.AsyncPoll" in repr(log)
    assert ts.to_dict()["server_target_qps"] == 12.5


# ----------------------------------------------------------------- FromConfig


def compare_from_config(
    tmp_path: Path, text: str, model: str, scenario: str, conf_type: int = 2, **preset
) -> int:
    """Runs both FromConfig on ``text``; asserts equal results; returns the code."""
    path = write(tmp_path / "user.conf", text)
    ref, mine = settings_pair(**preset)
    if conf_type == 1:
        # mlperf_loadgen's first conf_type=1 call equals these two calls.
        ref.FromConfig("", model, scenario, 0)
        code_ref = ref.FromConfig(path, model, scenario, 2)
        CF.reset_config_state()
    else:
        code_ref = ref.FromConfig(path, model, scenario, conf_type)
    code = mine.FromConfig(path, model, scenario, conf_type)
    assert code == code_ref, text
    assert diff_settings(ref, mine) == [], text
    return code


HANDWRITTEN_CONFIGS = [
    # (text, model, scenario, expected return code)
    ("", "m", "Offline", 0),
    ("m.Offline.min_duration = 5\n", "m", "Offline", 0),
    ("m.Offline.min_duration = 5", "m", "Offline", 0),  # no final newline
    ("m.Offline.min_duration = 5\n", "other", "Offline", 0),
    ("M.Offline.min_duration = 5\n", "m", "Offline", 0),  # model is case-sensitive
    ("m.offline.min_duration = 5\n", "m", "Offline", 0),  # and so is the scenario
    # Specificity: model.scenario > *.scenario > model.* > *.*, whatever the order.
    (("*.*.min_duration = 1\nm.*.min_duration = 2\n*.Offline.min_duration = 3\n"
      "m.Offline.min_duration = 4\n"), "m", "Offline", 0),
    (("m.Offline.min_duration = 4\n*.Offline.min_duration = 3\nm.*.min_duration = 2\n"
      "*.*.min_duration = 1\n"), "m", "Offline", 0),
    ("m.*.min_duration = 2\n*.Offline.min_duration = 3\n", "m", "Offline", 0),
    ("m.*.min_duration = 2\n*.*.min_duration = 1\n", "m", "Server", 0),
    ("m.Offline.min_duration = 1\nm.Offline.min_duration = 2\n", "m", "Offline", 0),
    # Comments, blank lines, white space.
    ("# comment\n\n   \n#x.y.z = 1\n", "m", "Offline", 0),
    ("#comment\n", "m", "Offline", 0),
    ("#comment with words\n", "m", "Offline", -22),
    ("m.Offline.min_duration = 5 # trailing comment\n", "m", "Offline", -22),
    ("  m.Offline.min_duration\t=\t7  \r\n", "m", "Offline", 0),
    ("m.Offline.min_duration = 1\x0b2\n", "m", "Offline", 0),
    ("m.Offline.min_duration =7\n", "m", "Offline", -22),
    ("m.Offline.min_duration=7\n", "m", "Offline", 0),
    ("m.Offline.min_duration =\n", "m", "Offline", 0),
    ("m.Offline.min_duration\n", "m", "Offline", 0),
    ("m.Offline.min_duration = 5 6\n", "m", "Offline", 0),
    ("m.Offline.min_duration = 5 x\n", "m", "Offline", -22),
    ("m.Offline.min_duration\xa0= 5\n", "m", "Offline", -22),
    # A bad line anywhere discards the whole file.
    ("m.Offline.min_duration = 3\nbad line here\nm.Offline.max_duration = 4\n",
     "m", "Offline", -22),
    ("m.Offline.target_qps = 1_000\n", "m", "Offline", -22),
    ("m.Offline.target_qps = 0x\n", "m", "Offline", -22),
    ("m.Offline.target_qps = 1e\n", "m", "Offline", -22),
    # Number syntax and conversion.
    ("m.Offline.min_duration = 010\n", "m", "Offline", 0),
    ("m.Offline.min_duration = 09\n", "m", "Offline", 0),
    ("m.Offline.min_duration = 0x1F\n", "m", "Offline", 0),
    ("m.Offline.min_duration = -1\n", "m", "Offline", 0),
    ("m.Offline.min_duration = 1e3\n", "m", "Offline", 0),
    ("m.Offline.min_duration = 2.9\n", "m", "Offline", 0),
    ("m.Offline.min_duration = 99999999999999999999999\n", "m", "Offline", 0),
    ("m.Offline.min_duration = -99999999999999999999999\n", "m", "Offline", 0),
    ("m.Offline.target_qps = 0x1.8p1\n", "m", "Offline", 0),
    ("m.Offline.target_qps = nan(abc)\n", "m", "Offline", 0),
    ("m.Offline.target_qps = -INFINITY\n", "m", "Offline", 0),
    ("m.Offline.target_qps = 1e999\n", "m", "Offline", 0),
    ("m.Offline.target_qps = .5\n", "m", "Offline", 0),
    ("m.Offline.target_qps = 5.\n", "m", "Offline", 0),
    ("m.Offline.target_qps = 010\n", "m", "Offline", 0),
    # Units and scales.
    ("*.*.target_latency = 5\n", "m", "Offline", 0),
    ("*.*.target_latency = 2.5\n", "m", "Server", 0),
    ("*.*.target_latency_percentile = 97.5\n", "m", "Offline", 0),
    ("*.*.accuracy_log_probability = 50\n", "m", "Offline", 0),  # mlperf.conf only
    (("*.Server.ttft_latency = 5\n*.Server.tpot_latency = 7\n"
      "*.*.use_token_latencies = 1\n"), "m", "Offline", 0),
    ("*.*.ttft_latency = 5\n", "m", "Server", 0),  # token latencies off: ignored
    ("*.*.token_latency_scaling_factor = 5\n*.*.infer_token_latencies = 1\n",
     "m", "Offline", 0),
    ("*.*.token_latency_scaling_factor = 5\n*.*.infer_token_latencies = 2\n",
     "m", "Offline", 0),
    # Flags: some keys test == 1, others != 0.
    (("*.*.use_token_latencies = 2\n*.*.sample_concatenate_permutation = 2\n"
      "*.*.performance_issue_unique = 2\n*.*.performance_issue_same = 2\n"
      "*.*.print_timestamps = 2\n*.*.coalesce_queries = 2\n"), "m", "Offline", 0),
    ("*.*.performance_issue_unique = 0.5\n*.*.print_timestamps = -1\n",
     "m", "Server", 0),
    # Scenario-bound keys apply whatever scenario is asked for.
    (("*.Server.target_qps = 7\n*.Offline.target_qps = 8\n"
      "*.Server.coalesce_queries = 1\n*.MultiStream.samples_per_query = 3\n"
      "*.SingleStream.target_latency = 4\n"),
     "m", "SingleStream", 0),
    ("*.Server.max_async_queries = 2147483648\n", "m", "Server", 0),
    ("*.Server.max_async_queries = 4294967301\n", "m", "Server", 0),
    # Keys mlperf.conf alone may set are ignored in a user file.
    (("*.*.qsl_rng_seed = 5\n*.*.sample_index_rng_seed = 6\n*.*.schedule_rng_seed = 7\n"
      "*.*.test05 = 1\n*.*.test05_qsl_rng_seed = 8\n"), "m", "Offline", 0),
    # Keys every file may set.
    (("*.*.mode = 1\n*.*.min_query_count = 3\n*.*.max_query_count = 4\n"
      "*.*.max_duration = 9\n*.*.performance_sample_count_override = 11\n"
      "*.*.accuracy_sample_count_override = 12\n*.*.performance_issue_same_index = 2\n"
      "*.*.accuracy_log_rng_seed = 13\n*.*.accuracy_log_sampling_target = 14\n"),
     "m", "MultiStream", 0),
    ("*.*.mode = 3\n", "m", "Server", 0),
    ("*.*.mode = 1.9\n", "m", "Server", 0),
    ("*.*.mode = 4\n", "m", "Server", 0),  # invalid mode: reported, ignored
    ("*.*.mode = -1\n", "m", "Server", 0),
    ("*.*.unknown_key = 5\n*.Server.target_duration = 3\n", "m", "Server", 0),
    ("resnet50.Offline.min_query_count = 5\n", "resnet50", "Offline", 0),
    ("wan-2.2-t2v-a14b.*.min_query_count = 5\n", "wan-2.2-t2v-a14b", "Offline", 0),
]  # fmt: skip


@pytest.mark.parametrize("conf_type", [2, 0, 1, 5])
@pytest.mark.parametrize("text, model, scenario, expected", HANDWRITTEN_CONFIGS)
def test_from_config_handwritten(tmp_path, text, model, scenario, expected, conf_type):
    code = compare_from_config(tmp_path, text, model, scenario, conf_type)
    assert code == (0 if conf_type == 0 else expected)


@pytest.mark.parametrize("conf_type", [2, 0])
def test_from_config_with_token_flags_preset(tmp_path, conf_type):
    text = (
        "*.Server.ttft_latency = 5\n*.Server.tpot_latency = 7\n"
        "*.*.token_latency_scaling_factor = 9\n"
    )
    compare_from_config(
        tmp_path,
        text,
        "m",
        "Offline",
        conf_type,
        use_token_latencies=True,
        infer_token_latencies=True,
    )


CONFIG_MODELS = ["m", "resnet50", "llama2-70b", "gptj", "M"]
CONFIG_SCENARIOS = ["*", *SCENARIOS, "offline"]
CONFIG_KEYS = [
    "mode", "qsl_rng_seed", "sample_index_rng_seed", "schedule_rng_seed",
    "accuracy_log_probability", "test05", "test05_qsl_rng_seed",
    "test05_sample_index_rng_seed", "test05_schedule_rng_seed", "use_token_latencies",
    "ttft_latency", "tpot_latency", "infer_token_latencies",
    "token_latency_scaling_factor", "target_latency_percentile", "samples_per_query",
    "target_latency", "performance_issue_unique", "performance_issue_same",
    "performance_issue_same_index", "sample_concatenate_permutation",
    "coalesce_queries", "max_async_queries", "min_duration", "max_duration",
    "min_query_count", "max_query_count", "performance_sample_count_override",
    "accuracy_sample_count_override", "target_qps", "print_timestamps",
    "accuracy_log_rng_seed", "accuracy_log_sampling_target", "unknown_key",
]  # fmt: skip
CONFIG_VALUES = [
    "0", "1", "2", "3", "4", "7", "-1", "1.5", "0.5", "90", "99.9", "1e3", "1e400",
    "0x10", "0X1f", "010", "09", "08.5", "+5", "-0", "inf", "-inf", "nan", "nan(x)",
    "0x1.8p1", ".5", "5.", "18446744073709551615", "18446744073709551616",
    "-99999999999999999999", "2147483648", "4294967301", "9223372036854775808",
    "1e-320", "12345678901234567890.5",
]  # fmt: skip
CONFIG_JUNK = ["x", "0x", "1e", "1_000", "--1", "#", "nan(", "infinit", "1e+"]
WHITE = [" ", "  ", "\t", " \t ", "\v", "\f", "\r"]


def random_config(rng: random.Random, junk_rate: float) -> str:
    lines = []
    for _ in range(rng.randint(0, 14)):
        roll = rng.random()
        if roll < 0.04:
            lines.append("# " + rng.choice(CONFIG_KEYS))
            continue
        if roll < 0.06:
            lines.append("")
            continue
        key = ".".join(
            (
                rng.choice(["*", *CONFIG_MODELS]),
                rng.choice(CONFIG_SCENARIOS),
                rng.choice(CONFIG_KEYS),
            )
        )
        value = rng.choice(CONFIG_JUNK if rng.random() < junk_rate else CONFIG_VALUES)
        line = f"{rng.choice(WHITE)}{key}{rng.choice(WHITE)}={rng.choice(WHITE)}{value}"
        if rng.random() < 0.04:
            line += rng.choice(WHITE) + rng.choice(CONFIG_VALUES + ["#"])
        if rng.random() < 0.02:
            line = key + "=" + value
        lines.append(line)
    return "\n".join(lines) + ("\n" if rng.random() < 0.5 else "")


@pytest.mark.parametrize("seed, junk_rate", [(1, 0.0), (2, 0.0), (3, 0.02)])
def test_from_config_generated(tmp_path, seed, junk_rate):
    rng = random.Random(seed)
    codes = set()
    for _ in range(400):
        text = random_config(rng, junk_rate)
        preset = {}
        if rng.random() < 0.3:
            preset["use_token_latencies"] = True
        if rng.random() < 0.3:
            preset["infer_token_latencies"] = True
        codes.add(
            compare_from_config(
                tmp_path,
                text,
                rng.choice(CONFIG_MODELS),
                rng.choice(SCENARIOS),
                rng.choice([0, 2, 2, 3]),
                **preset,
            )
        )
    assert 0 in codes
    assert -22 in codes  # a trailing '#' or junk value invalidates a file


def builtin_models() -> list[str]:
    models = set()
    for line in CF.BUILTIN_MLPERF_CONF.splitlines():
        tokens = line.split()
        if len(tokens) == 3 and tokens[1] == "=" and not tokens[0].startswith("*"):
            models.add(tokens[0].rsplit(".", 2)[0])
    return sorted(models)


def test_builtin_models_found():
    models = builtin_models()
    for name in (
        "resnet50",
        "llama2-70b",
        "gptj",
        "bert",
        "3d-unet",
        "retinanet",
        "rnnt",
        "wan-2.2-t2v-a14b",
        "gpt-oss-120b-interactive",
    ):
        assert name in models
    assert len(models) >= 28


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("token_flags", [False, True])
def test_builtin_conf_matches_lg(scenario, token_flags):
    for model in [*builtin_models(), "unknown-model", "*"]:
        preset = (
            {"use_token_latencies": True, "infer_token_latencies": True}
            if token_flags
            else {}
        )
        ref, mine = settings_pair(**preset)
        assert ref.FromConfig("ignored", model, scenario, 0) == 0
        assert mine.FromConfig("ignored", model, scenario, 0) == 0
        assert diff_settings(ref, mine) == [], model


def test_builtin_conf_known_values():
    ts = S.TestSettings()
    assert ts.FromConfig("", "llama2-70b", "Server", 0) == 0
    assert ts.use_token_latencies and ts.ttft_latency == 2_000_000_000
    assert ts.tpot_latency == 200_000_000 and ts.server_target_latency_ns == 0
    assert ts.performance_sample_count_override == 24576
    assert ts.sample_concatenate_permutation and ts.min_duration_ms == 600000
    assert ts.qsl_rng_seed == 2085463073848966840
    assert ts.schedule_rng_seed == 16159082839903944936
    assert ts.test05_sample_index_rng_seed == 11403566307062068064

    ts = S.TestSettings()
    ts.FromConfig("", "resnet50", "Offline", 0)
    assert ts.min_query_count == 24576 and ts.server_target_latency_ns == 15_000_000
    assert ts.single_stream_target_latency_percentile == 0.9
    assert ts.single_stream_expected_latency_ns == 10_000_000.0

    ts = S.TestSettings()
    ts.FromConfig("", "gptj", "Offline", 0)
    assert ts.infer_token_latencies and ts.token_latency_scaling_factor == 69


def test_builtin_conf_is_the_release_file():
    if not SDIST_CONF.exists():
        pytest.skip("MLPerf LoadGen 6.0.17 sources not unpacked here")
    assert CF.BUILTIN_MLPERF_CONF == SDIST_CONF.read_text()


def test_from_config_unreadable_paths(tmp_path):
    (tmp_path / "a_directory").mkdir()
    cases = [
        (str(tmp_path / "missing.conf"), -2),
        ("", -2),
        (str(tmp_path / "a_directory"), 0),
        (str(tmp_path / "user.conf") + "\0suffix", 0),
    ]
    write(tmp_path / "user.conf", "*.*.min_duration = 5\n")
    for path, expected in cases:
        ref, mine = settings_pair()
        assert ref.FromConfig(path, "m", "Offline", 2) == expected, path
        assert mine.FromConfig(path, "m", "Offline", 2) == expected, path
        assert diff_settings(ref, mine) == []
    assert mine.min_duration_ms == 5


def test_from_config_conf_type_1_missing_file_still_loads_builtin(tmp_path):
    ts = S.TestSettings()
    assert ts.FromConfig(str(tmp_path / "missing"), "resnet50", "Offline") == -2
    assert ts.performance_sample_count_override == 1024
    CF.reset_config_state()
    ts = S.TestSettings()
    bad = write(tmp_path / "bad.conf", "resnet50.Offline.min_query_count = x\n")
    assert ts.FromConfig(bad, "resnet50", "Offline") == -22
    assert ts.min_query_count == 24576  # from the built-in file only


def test_from_config_arguments(tmp_path):
    path = write(tmp_path / "user.conf", "m.Offline.min_duration = 5\n")
    ref, mine = settings_pair()
    assert ref.FromConfig(path.encode(), b"m", "Offline", True) == 0
    assert mine.FromConfig(path.encode(), b"m", "Offline", True) == 0
    assert diff_settings(ref, mine) == []
    assert mine.FromConfig(Path(path), "m", "Offline", conf_type=2) == 0
    for bad_args in [
        (None, "m", "Offline", 2),
        (path, None, "Offline", 2),
        (path, "m", 3, 2),
        (path, "m", "Offline", 2.0),
        (path, "m", "Offline", 2**31),
    ]:
        with pytest.raises(TypeError):
            lg.TestSettings().FromConfig(*bad_args)
        with pytest.raises(TypeError):
            S.TestSettings().FromConfig(*bad_args)


def test_from_config_non_ascii_model(tmp_path):
    path = tmp_path / "user.conf"
    path.write_bytes("m\u00e9.Offline.min_duration = 5\n".encode())
    ref, mine = settings_pair()
    ref.FromConfig(str(path), "m\u00e9", "Offline", 2)
    mine.FromConfig(str(path), "m\u00e9", "Offline", 2)
    assert diff_settings(ref, mine) == [] and mine.min_duration_ms == 5


def test_config_errors_are_reported(tmp_path):
    assert CF.take_config_errors() == []
    bad = write(tmp_path / "bad.conf", "a.b.c = x\nq w e\n*.*.mode = 9\n")
    assert S.TestSettings().FromConfig(bad, "m", "Offline", 2) == -22
    errors = CF.take_config_errors()
    assert len(errors) == 2
    assert "line 1" in errors[0] and "line 2" in errors[1]
    assert CF.take_config_errors() == []

    mode = write(tmp_path / "mode.conf", "*.*.mode = 9\n")
    assert S.TestSettings().FromConfig(mode, "m", "Offline", 2) == 0
    assert len(CF.take_config_errors()) == 1

    assert S.TestSettings().FromConfig(str(tmp_path / "nope"), "m", "Offline", 2) == -2
    assert "nope" in CF.take_config_errors()[0]

    good = write(tmp_path / "good.conf", "")
    assert S.TestSettings().FromConfig(good, "m", "Offline") == 0
    assert CF.take_config_errors() == []
    second = S.TestSettings()
    assert second.FromConfig(good, "resnet50", "Offline") == 0
    assert len(CF.take_config_errors()) == 1  # a second user configuration
    assert second.performance_sample_count_override == 0  # no built-in this time


# ---------------------------------------------------------- effective settings


def test_effective_offline_hand_checked():
    ts = S.TestSettings(scenario=SC.Offline, offline_expected_qps=1000)
    ts.min_duration_ms = 10000
    eff = E.effective_settings(ts, 1024, 50000)
    # 1.1 * 10 s * 1000/s = 11000 > min_query_count (100)
    assert eff.samples_per_query == 11000
    assert eff.min_query_count == 1 and eff.min_sample_count == 11000
    assert eff.target_qps == 1000.0 and eff.max_async_queries == 1
    assert eff.target_duration_ns == 0 and eff.min_duration_ns == 10**10
    assert eff.target_latency_ns == 0 and eff.target_latency_percentile == 0.99
    assert eff.performance_sample_count == 1024 and eff.accuracy_sample_count == 50000
    assert eff.setting_errors == () and eff.scenario is SC.Offline
    assert eff.requested == ts and eff.requested is not ts

    ts.min_query_count = 24576
    assert E.effective_settings(ts, 1024, 50000).samples_per_query == 24576
    ts.offline_expected_qps = 0.5
    ts.min_query_count = 0
    ts.min_duration_ms = 1000  # 1.1 * 1 s * 0.5/s = 0.55 -> 0
    assert E.effective_settings(ts, 1024, 50000).samples_per_query == 0
    ts.performance_issue_unique = True
    ts.performance_sample_count_override = 77
    eff = E.effective_settings(ts, 1024, 50000)
    assert eff.samples_per_query == 77 and eff.performance_sample_count == 77


def test_effective_offline_truncation_of_the_slack_product():
    ts = S.TestSettings(scenario=SC.Offline, min_query_count=1)
    # 1.1 * 600 s * 123.4/s = 81444.0000...01 or 81443.99...: truncated as C++ does
    for qps, duration_ms in [(123.4, 600000), (3.3, 1000), (0.1, 100), (7.77, 60000)]:
        ts.offline_expected_qps = qps
        ts.min_duration_ms = duration_ms
        expected = int(1.1 * (duration_ms / 1000.0) * qps)
        assert E.effective_settings(ts, 10, 10).samples_per_query == max(1, expected)


def test_effective_single_and_multi_stream():
    ts = S.TestSettings()
    eff = E.effective_settings(ts, 10, 100)
    assert eff.target_qps == 1000.0 and eff.max_async_queries == 1
    assert eff.samples_per_query == 1 and eff.min_query_count == 100
    assert eff.target_duration_ns == eff.min_duration_ns == 10_000_000_000
    assert eff.target_latency_percentile == 0.9 and eff.min_sample_count == 100

    ts = S.TestSettings(scenario=SC.MultiStream, multi_stream_samples_per_query=4)
    ts.min_query_count = 662
    eff = E.effective_settings(ts, 10, 100)
    assert eff.target_qps == 125.0 and eff.samples_per_query == 4
    assert eff.min_sample_count == 2648 and eff.target_latency_percentile == 0.99


def test_effective_single_stream_equal_issue_rule():
    ts = S.TestSettings(sample_concatenate_permutation=True)
    ts.min_duration_ms = 600000
    ts.single_stream_expected_latency_ns = 10_000_000  # 100 queries/s
    ts.min_query_count = 100
    # 2 * 600 s * 100/s = 120000; next multiple of 43 strictly above: 120013
    eff = E.effective_settings(ts, 43, 43)
    assert eff.min_query_count == 120013 and eff.min_sample_count == 120013
    # Already a multiple: one more full round is added.
    ts.min_query_count = 129
    ts.min_duration_ms = 0
    assert E.effective_settings(ts, 43, 43).min_query_count == 172
    # The QSL count is used, not the override.
    ts.performance_sample_count_override = 10
    assert E.effective_settings(ts, 43, 43).min_query_count == 172
    # Not applied to other scenarios.
    ts.scenario = SC.MultiStream
    assert E.effective_settings(ts, 43, 43).min_query_count == 129
    ts.scenario = SC.SingleStream
    with pytest.raises(ValueError):
        E.effective_settings(ts, 0, 43)


def test_effective_server_and_errors():
    ts = S.TestSettings(scenario=SC.Server, server_target_qps=250.5)
    ts.server_target_latency_ns = 15_000_000
    ts.server_max_async_queries = 8
    ts.server_target_latency_percentile = 0.97
    eff = E.effective_settings(ts, 10, 100)
    assert eff.target_qps == 250.5 and eff.target_latency_ns == 15_000_000
    assert eff.max_async_queries == 8 and eff.target_latency_percentile == 0.97
    assert eff.setting_errors == ()

    ts.server_target_qps = -1.0
    ts.performance_issue_same = True
    ts.performance_issue_same_index = 10
    ts.performance_issue_unique = True
    eff = E.effective_settings(ts, 10, 100)
    assert eff.target_qps == 1.0
    assert len(eff.setting_errors) == 3
    assert "server_target_qps" in eff.setting_errors[0]
    assert "performance_issue_same_index" in eff.setting_errors[1]
    assert "performance_issue_unique" in eff.setting_errors[2]

    ts = S.TestSettings(scenario=SC.Offline, offline_expected_qps=math.nan)
    eff = E.effective_settings(ts, 10, 100)
    assert eff.target_qps == 1.0 and len(eff.setting_errors) == 1


def test_effective_wraps_like_cpp():
    ts = S.TestSettings(min_duration_ms=U64, max_duration_ms=2**63)
    ts.ttft_latency = U64
    ts.min_query_count = 2**63
    ts.scenario = SC.MultiStream
    eff = E.effective_settings(ts, 10, 100)
    assert eff.min_duration_ns == -1_000_000 and eff.min_duration_ms == -1
    assert eff.max_duration_ns == -(2**63) * 1_000_000
    assert eff.server_ttft_latency == -1
    assert eff.min_sample_count == (2**63 * 8) % 2**64 == 0


def test_double_to_uint64_conversion():
    convert = E._double_to_uint64
    assert convert(11000.999) == 11000
    assert convert(0.0) == 0 and convert(-0.0) == 0
    assert convert(-5.5) == 2**64 - 5
    assert convert(2.0**63) == 2**63 and convert(2.0**64 - 2048) == 2**64 - 2048
    assert convert(2.0**64) == 0 and convert(math.inf) == 0
    assert convert(math.nan) == 2**63 and convert(-math.inf) == 2**63
    assert convert(-(2.0**63)) == 2**63 and convert(-1e30) == 2**63


def test_effective_settings_argument_types():
    with pytest.raises(TypeError):
        E.effective_settings(lg.TestSettings(), 1, 1)
    with pytest.raises(TypeError):
        E.effective_settings(S.TestSettings(), -1, 1)
    with pytest.raises(TypeError):
        E.effective_settings(S.TestSettings(), 1, 1.0)
    eff = E.effective_settings(S.TestSettings(), np.int64(5), 6)
    with pytest.raises(AttributeError):
        eff.target_qps = 2.0  # frozen
    assert eff == E.effective_settings(S.TestSettings(), 5, 6)
    assert hash(eff) == hash(E.effective_settings(S.TestSettings(), 5, 6))


def test_apply_test05():
    ts = S.TestSettings(mode=MO.AccuracyOnly, qsl_rng_seed=1, schedule_rng_seed=3)
    ts.test05_qsl_rng_seed = 11
    ts.test05_sample_index_rng_seed = 12
    ts.test05_schedule_rng_seed = 13
    plain = E.apply_test05(ts)
    assert plain == ts and plain is not ts
    ts.test05 = True
    adjusted = E.apply_test05(ts)
    assert adjusted.mode is MO.PerformanceOnly
    assert (
        adjusted.qsl_rng_seed,
        adjusted.sample_index_rng_seed,
        adjusted.schedule_rng_seed,
    ) == (11, 12, 13)
    assert ts.mode is MO.AccuracyOnly and ts.qsl_rng_seed == 1


# ------------------------------------------------------- detail log entries


def lg_detail_log(ts, performance_count: int, total_count: int, outdir: Path):
    """Runs mlperf_loadgen with an instant SUT; returns its detail log entries."""

    def issue(samples):
        lg.QuerySamplesComplete([lg.QuerySampleResponse(s.id, 0, 0) for s in samples])

    sut = lg.ConstructSUT(issue, lambda: None)
    qsl = lg.ConstructQSL(
        total_count, performance_count, lambda s: None, lambda s: None
    )
    log = lg.LogSettings()
    log.log_output.outdir = str(outdir)
    log.enable_trace = False
    try:
        lg.StartTestWithLogSettings(sut, qsl, ts, log)
    finally:
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
    entries = []
    for line in (outdir / "mlperf_log_detail.txt").read_text().splitlines():
        if line.startswith(":::MLLOG "):
            record = json.loads(line[len(":::MLLOG ") :])
            entries.append((record["key"], record["value"]))
    return entries


def logged_equal(ref, mine) -> bool:
    """MLPerf prints doubles with 6 significant digits, the rest exactly."""
    if isinstance(mine, (bool, str)) or isinstance(ref, (bool, str)):
        return type(ref) is type(mine) and ref == mine
    if isinstance(mine, float):
        return math.isclose(ref, mine, rel_tol=1e-5)
    return type(ref) is int and ref == mine


def run_case(performance_count: int, total_count: int, **fields):
    return fields, performance_count, total_count


LOGGED_RUNS = [
    run_case(
        10, 100, scenario=SC.Offline, offline_expected_qps=1000, min_duration_ms=10000
    ),
    run_case(
        10,
        100,
        scenario=SC.Offline,
        offline_expected_qps=-3.0,
        min_duration_ms=1000,
        performance_issue_same=True,
        performance_issue_same_index=12,
    ),
    run_case(
        10,
        100,
        scenario=SC.Offline,
        offline_expected_qps=333.3,
        min_duration_ms=3,
        use_token_latencies=True,
        accuracy_sample_count_override=5,
        performance_issue_unique=True,
        performance_sample_count_override=7,
    ),
    run_case(
        10,
        100,
        scenario=SC.SingleStream,
        min_duration_ms=10,
        min_query_count=20,
        single_stream_expected_latency_ns=1e5,
        sample_concatenate_permutation=True,
    ),
    run_case(
        10,
        30,
        scenario=SC.SingleStream,
        mode=MO.AccuracyOnly,
        min_duration_ms=10,
        min_query_count=5,
        single_stream_target_latency_percentile=0.975,
    ),
    run_case(
        16,
        100,
        scenario=SC.MultiStream,
        min_duration_ms=10,
        min_query_count=30,
        multi_stream_samples_per_query=4,
        multi_stream_expected_latency_ns=2.5e6,
    ),
    run_case(
        10,
        100,
        scenario=SC.Server,
        server_target_qps=100000,
        min_duration_ms=5,
        min_query_count=30,
        server_max_async_queries=3,
        server_coalesce_queries=True,
        server_target_latency_ns=5_000_000,
        use_token_latencies=True,
        ttft_latency=123,
        tpot_latency=456,
        print_timestamps=True,
    ),
    run_case(
        10,
        100,
        scenario=SC.Server,
        server_target_qps=50000.5,
        min_duration_ms=5,
        min_query_count=20,
        max_query_count=40,
        accuracy_log_probability=0.25,
        accuracy_log_rng_seed=7,
        qsl_rng_seed=3,
        sample_index_rng_seed=4,
        schedule_rng_seed=5,
        accuracy_log_sampling_target=2,
    ),
]


@pytest.mark.parametrize("fields, performance_count, total_count", LOGGED_RUNS)
def test_log_items_match_lg_detail_log(
    tmp_path, capsys, fields, performance_count, total_count
):
    ref, mine = settings_pair(**fields)
    entries = lg_detail_log(ref, performance_count, total_count, tmp_path)
    logged = [(k, v) for k, v in entries if k.startswith(("requested_", "effective_"))]
    errors = [v for k, v in entries if k == "error_invalid_test_settings"]

    eff = E.effective_settings(mine, performance_count, total_count)
    items = DI.all_log_items(eff)
    assert items == DI.requested_log_items(mine) + DI.effective_log_items(eff)
    assert [k for k, _ in items] == [k for k, _ in logged]
    for (key, ref_value), (_, value) in zip(logged, items):
        assert logged_equal(ref_value, value), (key, ref_value, value)
    assert len(eff.setting_errors) == len(errors)


def test_log_item_value_types():
    eff = E.effective_settings(S.TestSettings(scenario=SC.Server), 10, 100)
    requested = dict(DI.requested_log_items(eff.requested))
    effective = dict(DI.effective_log_items(eff))
    assert requested["requested_scenario"] == "Server"
    assert requested["requested_test_mode"] == "PerformanceOnly"
    assert type(requested["requested_server_target_qps"]) is float
    assert type(requested["requested_server_target_latency_ns"]) is int
    assert requested["requested_server_coalesce_queries"] is False
    assert "requested_use_token_latencies" not in requested
    assert effective["effective_target_duration_ms"] == 10000
    assert effective["effective_target_latency_ns"] == 100_000_000
    assert type(effective["effective_target_qps"]) is float
    assert effective["effective_sample_concatenate_permutation"] is False
