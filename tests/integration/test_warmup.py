"""Warm-up (--warmup-s, EngineSettings.warmup_s): queries scheduled in the first warmup_s
are issued at the schedule but not recorded; they are counted apart, and every bound,
duration, histogram and the time series start at the end of the warm-up.

The tests that start processes; the in-process ones are in tests/unit/test_warmup.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from loadgen.results import load_result


@pytest.mark.integration
def test_cli_reports_the_warmup_in_the_result_and_summary(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "loadgen", "run", "--sut", "demo", "--scenario", "constant", "--target-qps", "500",
         "--duration-s", "0.5", "--warmup-s", "0.3", "--max-issue-delay-ms", "50", "--output", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "warm-up      0.3 s first, not recorded" in out.stdout
    doc = json.loads((tmp_path / "result.json").read_text())
    assert doc["warmup"]["duration_s"] == 0.3
    assert doc["warmup"]["issued"] == pytest.approx(150, abs=2)
    assert "warmup_issued" not in doc["counts"]
    assert doc["counts"]["issued"] == pytest.approx(250, abs=2)
    load_result(tmp_path / "result.json")  # follows the schema
    bad = subprocess.run([sys.executable, "-m", "loadgen", "run", "--scenario", "offline", "--warmup-s", "1"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--warmup-s" in bad.stderr
