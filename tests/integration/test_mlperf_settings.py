"""loadgen.mlperf.settings against the MLPerf LoadGen Python module (mlperf_loadgen).

The tests that start processes; the in-process ones are in tests/unit/test_mlperf_settings.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from loadgen.mlperf import settings as S
from tests.unit.test_mlperf_settings import write

_COUNTER_SCRIPT = textwrap.dedent(
    """
    import json, math, sys
    import mlperf_loadgen as lg
    from loadgen.mlperf import settings as S

    def dump(ts):
        out = {}
        for name in S.TEST_SETTINGS_FIELDS:
            value = getattr(ts, name)
            if hasattr(value, "name"):
                value = value.name
            elif isinstance(value, float) and math.isnan(value):
                value = "nan"
            out[name] = value
        return out

    user, missing = sys.argv[1], sys.argv[2]
    calls = [(missing, "gptj", "Server"), (user, "llama2-70b", "Server"),
             (user, "resnet50", "Offline")]
    result = {}
    for label, module in (("lg", lg), ("mine", S)):
        rows = []
        for path, model, scenario in calls:
            ts = module.TestSettings()
            code = ts.FromConfig(path, model, scenario)
            rows.append([code, dump(ts)])
        result[label] = rows
    print(json.dumps(result))
    """
)


def test_builtin_conf_loaded_once_per_process_like_lg(tmp_path):
    user = write(tmp_path / "user.conf", "*.*.min_query_count = 7\n")
    repo_root = Path(S.__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(repo_root))
    run = subprocess.run(
        [sys.executable, "-c", _COUNTER_SCRIPT, user, str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["mine"] == result["lg"]
    first, second, _ = result["mine"]
    assert first[0] == -2 and first[1]["performance_sample_count_override"] == 13368
    assert second[0] == 0 and second[1]["performance_sample_count_override"] == 0
    assert second[1]["min_query_count"] == 7
