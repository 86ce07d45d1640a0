#!/usr/bin/env bash
# The GPU sampler's check on a machine with an NVIDIA GPU, in one command:
#
#   bash scripts/gpu_check.sh [options of bench/bench_gpu.py --check, e.g. --duration-s 60]
#
# 1. stops at once, exit 3, where no NVIDIA driver can be loaded (no pip, no build);
# 2. installs what is missing, into GPU_CHECK_DIR/site (nothing system-wide):
#    nvidia-ml-py, numpy, and cupy-cuda12x unless CuPy or PyTorch is already there
#    (cupy-cuda12x[ctk] when plain CuPy finds no CUDA libraries);
# 3. builds loadgen's extension in place if this Python cannot import it;
# 4. runs bench/bench_gpu.py --check: a loadgen run whose Python SUT multiplies 8192x8192
#    fp16 matrices on the GPU, with the sampler on, and checks utilization > 80%, energy
#    and energy per query, power within the board's limit, sampler CPU < 1% of a core.
#
# Exit codes: 0 PASS; 1 a check failed; 3 no NVIDIA GPU/driver; 4 setup failed (install,
# build, GPU library); 124 the time budget ran out.
# Environment: GPU_CHECK_BUDGET_S (everything, installs included; default 480),
# GPU_CHECK_DIR (output; default ./gpu-check), PYTHON (default python3).
# Everything printed also goes to GPU_CHECK_DIR/gpu_check.log, named on the last line.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${GPU_CHECK_DIR:-$ROOT/gpu-check}
BUDGET=${GPU_CHECK_BUDGET_S:-480}
PY=${PYTHON:-python3}
LOG=$DIR/gpu_check.log

left() {
  local n=$((BUDGET - SECONDS))
  if ((n < 1)); then n=1; fi
  echo "$n"
}

# main prints one "GPU CHECK: ..." line and returns the exit code.
main() {
  echo "gpu_check: $(date -u +%Y-%m-%dT%H:%M:%SZ), budget ${BUDGET} s, python: $PY, output: $DIR"
  if ! command -v "$PY" >/dev/null; then
    echo "GPU CHECK: SETUP FAILED: no $PY"
    return 4
  fi
  if ! "$PY" -c 'import ctypes; ctypes.CDLL("libnvidia-ml.so.1")' 2>/dev/null; then
    echo "GPU CHECK: SKIP: no NVIDIA GPU/driver (libnvidia-ml.so.1 cannot be loaded)"
    return 3
  fi
  command -v nvidia-smi >/dev/null && nvidia-smi -L
  local site=$DIR/site
  export PYTHONPATH="$ROOT:$site${PYTHONPATH:+:$PYTHONPATH}"
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  local need=()
  "$PY" -c 'import pynvml' 2>/dev/null || need+=(nvidia-ml-py)
  "$PY" -c 'import numpy' 2>/dev/null || need+=(numpy)
  if ! "$PY" -c 'import cupy' 2>/dev/null && ! "$PY" -c 'import torch' 2>/dev/null; then
    need+=(cupy-cuda12x)
  fi
  if ((${#need[@]})); then
    echo "installing into $site: ${need[*]}"
    timeout "$(left)" "$PY" -m pip install -q --target "$site" "${need[@]}"
    local rc=$?
    if ((rc == 124)); then echo "GPU CHECK: TIME BUDGET (${BUDGET} s) ran out during pip install"; return 124; fi
    if ((rc != 0)); then echo "GPU CHECK: SETUP FAILED: pip install ${need[*]} (exit $rc)"; return 4; fi
  fi
  if [[ " ${need[*]} " == *" cupy-cuda12x "* ]] &&
     ! "$PY" -c 'import cupy; a = cupy.ones((64, 64), cupy.float16); (a @ a).sum().item()' 2>/dev/null; then
    echo "CuPy finds no CUDA libraries: installing cupy-cuda12x[ctk]"
    timeout "$(left)" "$PY" -m pip install -q --target "$site" --upgrade 'cupy-cuda12x[ctk]' ||
      { echo "GPU CHECK: SETUP FAILED: pip install cupy-cuda12x[ctk]"; return 4; }
  fi
  if ! "$PY" -c 'import loadgen._core' 2>/dev/null; then
    echo "building loadgen's extension for $("$PY" --version 2>&1)"
    (cd "$ROOT" && timeout "$(left)" "$PY" setup.py -q build_ext --inplace) ||
      { echo "GPU CHECK: SETUP FAILED: could not build loadgen._core"; return 4; }
  fi
  echo "checking (${SECONDS} s used of ${BUDGET} s)"
  PYTHONUNBUFFERED=1 timeout "$(left)" "$PY" "$ROOT/bench/bench_gpu.py" --check --out "$DIR" "$@"
  local rc=$?
  case $rc in
    0) ;;  # bench_gpu.py printed "GPU CHECK: PASS ..."
    1) ;;  # and "GPU CHECK: FAIL ..."
    3) echo "GPU CHECK: SKIP: no NVIDIA GPU/driver" ;;
    124) echo "GPU CHECK: TIME BUDGET (${BUDGET} s) ran out during the check" ;;
    *) echo "GPU CHECK: SETUP FAILED: bench_gpu.py --check exited $rc"; rc=4 ;;
  esac
  return "$rc"
}

mkdir -p "$DIR" || exit 4
main "$@" 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
echo "exit $rc; full output: $LOG" | tee -a "$LOG"
exit "$rc"
