"""Behaviour of :mod:`loadgen.mlperf`'s runtime: handles, errors, completions, modes.

The tests that start processes; the in-process ones are in tests/unit/test_mlperf_runtime.py."""

from __future__ import annotations

import json
from pathlib import Path


def test_example_harness_runs_on_both_modules(tmp_path):
    """examples/mlperf_harness.py runs unchanged on either module and is VALID."""
    import subprocess
    import sys

    example = Path(__file__).resolve().parents[2] / "examples" / "mlperf_harness.py"
    for module in ("loadgen.mlperf", "mlperf_loadgen"):
        out = subprocess.run(
            [sys.executable, str(example), "--module", module, "--scenario", "Offline",
             "--mode", "SubmissionRun", "--outdir", str(tmp_path / module)],
            capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert "Result is : VALID" in out.stdout
        entries = json.loads((tmp_path / module / "mlperf_log_accuracy.json").read_text())
        assert len(entries) == 1024  # every sample, each its index squared
        for e in entries[:50]:
            assert int.from_bytes(bytes.fromhex(e["data"]), "little") == e["qsl_idx"] ** 2
