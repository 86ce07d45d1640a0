#!/usr/bin/env bash
# Builds loadgen's native extension with sanitizers and runs the tests that drive it.
#
#   bash scripts/sanitize.sh asan   ASan + UBSan build; the C++-facing tests (histogram,
#                                   codec, engine, recorder, MLPerf loop, SSE scanner and
#                                   the native client's OpenAI streams, the native gRPC client)
#   bash scripts/sanitize.sh tsan   TSan build; the completion-path stress tests (and the
#                                   native clients' OpenAI streams and gRPC calls)
#   ... asan -- -k codec            arguments after "--" go to pytest (a subset)
#   SANITIZE_TESTS="tests/unit/test_codec.py tests/unit/test_histogram.py" ... asan
#                                   these test files instead of the mode's list
#
# The sanitized build goes to build/sanitize-<mode>/ (never in place: the normal build in
# loadgen/ is left as it is): the Python sources are copied there and the extension is
# compiled next to them, and the tests import loadgen from that copy (PYTHONPATH). Python
# itself is not instrumented, so the sanitizer runtime is loaded with LD_PRELOAD. Any
# sanitizer report ends the process with a non-zero status and fails the script.
#
# PYTHON (default: python) runs the tests; BUILD_PYTHON (default: $PYTHON) builds, and
# must have setuptools and pybind11 (installed with pip when missing). The build is
# incremental: a rerun compiles only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"

mode="${1:-asan}"
shift || true
if [[ "${1:-}" == "--" ]]; then shift; fi
PYTHON="${PYTHON:-python}"
BUILD_PYTHON="${BUILD_PYTHON:-$PYTHON}"
CXX="${CXX:-g++}"

case "$mode" in
  asan)
    # -O0: the same reports as -O1 and a shorter build (bindings/bind_engine.cc, pybind11's
    # templates under instrumentation: 39 s against 100 s); the tests run a little slower.
    # On 2 cores the build takes about 1 min, the CI subset's tests about 45 s.
    flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O0"
    runtime="$("$CXX" -print-file-name=libasan.so)"
    tests=(tests/unit/test_histogram.py tests/unit/test_codec.py tests/unit/test_engine.py tests/unit/test_recorder.py
           tests/unit/test_mlperf_runtime.py tests/integration/test_mlperf_runtime.py
           tests/unit/test_records.py::test_every_sut_form_gets_one_row_per_query
           tests/unit/test_native_sse.py::test_native_scanner_agrees_with_token_stream
           tests/unit/test_native_sse.py::test_native_scanner_agrees_on_events_over_the_limit
           tests/unit/test_native_sse.py::test_native_scanner_agrees_on_any_bytes
           tests/integration/test_native_sse.py::test_in_process_native_streams_through_the_python_api
           tests/integration/test_native_grpc.py
           tests/integration/test_native_tls.py::test_in_process_runs_over_tls_through_the_python_api
           tests/integration/test_native_tls.py::test_grpcs_reconnects_mid_run_shake_hands_without_blocking_and_resume)
    ;;
  tsan)
    flags="-fsanitize=thread -fno-omit-frame-pointer -g -O1"
    runtime="$("$CXX" -print-file-name=libtsan.so)"
    tests=(tests/unit/test_sanitizers.py
           tests/unit/test_engine.py::test_stop_from_another_thread_ends_a_long_run_with_counts_adding_up
           tests/unit/test_engine.py::test_closed_loop_never_exceeds_concurrency_in_flight
           tests/unit/test_engine.py::test_async_sut_many_concurrent_coroutines
           tests/unit/test_engine.py::test_fixed_delay_sut_with_timeouts_still_completes_the_rest_on_time
           tests/unit/test_mlperf_runtime.py::test_multistream_samples_completed_by_different_threads
           tests/unit/test_mlperf_runtime.py::test_offline_10k_samples_completed_in_chunks_from_three_threads
           tests/unit/test_records.py::test_every_sut_form_gets_one_row_per_query
           tests/integration/test_native_sse.py::test_in_process_native_streams_through_the_python_api
           tests/integration/test_native_grpc.py::test_in_process_calls_with_no_grpcio_thread
           "tests/integration/test_native_tls.py::test_in_process_runs_over_tls_through_the_python_api[http]"
           tests/integration/test_native_tls.py::test_grpcs_reconnects_mid_run_shake_hands_without_blocking_and_resume)
    ;;
  *)
    echo "usage: $0 asan|tsan [-- pytest arguments]" >&2
    exit 2
    ;;
esac
# libstdc++ goes in too: the runtime's __cxa_throw interceptor needs the real one loaded
# when it starts, and python itself does not link it (else every C++ throw aborts).
runtime="$runtime $(readlink -f "$("$CXX" -print-file-name=libstdc++.so)")"
if [[ -n "${SANITIZE_TESTS:-}" ]]; then
  read -r -a tests <<<"$SANITIZE_TESTS"
fi
if [[ ! -e "${runtime%% *}" ]]; then
  echo "sanitize.sh: the $mode runtime of $CXX is not installed (${runtime%% *})" >&2
  exit 2
fi

out="$root/build/sanitize-$mode"
mkdir -p "$out/lib" "$out/tmp"

if ! "$BUILD_PYTHON" -c "import pybind11, setuptools" 2>/dev/null; then
  "$BUILD_PYTHON" -m pip install -q pybind11 setuptools
fi

# The Python sources, copied beside the sanitized extension (stale copies removed).
rm -rf "$out/lib/loadgen.new"
mkdir -p "$out/lib/loadgen.new"
tar -C loadgen --exclude='*.so' --exclude='__pycache__' -cf - . | tar -C "$out/lib/loadgen.new" -xf -
if [[ -d "$out/lib/loadgen" ]]; then
  find "$out/lib/loadgen" -name '_core*.so' -exec mv {} "$out/lib/loadgen.new/" \;
  rm -rf "$out/lib/loadgen"
fi
mv "$out/lib/loadgen.new" "$out/lib/loadgen"

start=$(date +%s)
echo "sanitize.sh: building the $mode extension in $out"
# setup.py's build with two changes. Its sources compile side by side, one per core
# (pybind11's ParallelCompile: build_ext's own --parallel only builds whole extensions side
# by side, and there is one). And the flags above come after setup.py's
# extra_compile_args too, since the compiler takes the last -O it is given: without that,
# setup.py's -O3 would win over the -O level chosen here.
CC="${CC:-gcc}" CXX="$CXX" CFLAGS="$flags" CXXFLAGS="$flags" LDFLAGS="$flags" SANITIZE_FLAGS="$flags" \
  "$BUILD_PYTHON" - -q build_ext --build-lib "$out/lib" --build-temp "$out/tmp" \
    >"$out/build.log" 2>&1 <<'PY' || { cat "$out/build.log" >&2; exit 1; }
import os
import runpy
import sys

from pybind11.setup_helpers import ParallelCompile
from setuptools.command.build_ext import build_ext

flags = os.environ["SANITIZE_FLAGS"].split()
build_extension = build_ext.build_extension


def build_extension_with_flags_last(self, ext):
    ext.extra_compile_args = [*ext.extra_compile_args, *flags]
    ext.extra_link_args = [*ext.extra_link_args, *flags]
    build_extension(self, ext)


build_ext.build_extension = build_extension_with_flags_last
ParallelCompile().install()  # a compile per core; every source compiled when the extension is rebuilt
sys.argv = ["setup.py", *sys.argv[1:]]
runpy.run_path("setup.py", run_name="__main__")
PY
# build_ext skips an up-to-date extension but does not notice a new copy of the sources.
so="$(find "$out/lib/loadgen" -maxdepth 1 -name '_core*.so' | head -1)"
if [[ -z "$so" ]]; then echo "sanitize.sh: no extension built (see $out/build.log)" >&2; exit 1; fi
built=$(date +%s)
echo "sanitize.sh: built in $((built - start)) s: $so"

# Reports go to files, not stderr: pytest captures stderr and a process that a sanitizer
# ends takes its captured output with it; and a report from a subprocess whose failure a
# test expects would otherwise pass unseen. Any report fails the script.
reports="$out/reports"
rm -rf "$reports"
mkdir -p "$reports"
common="print_stacktrace=1:halt_on_error=1:log_path=$reports/$mode"
export ASAN_OPTIONS="detect_leaks=0:verify_asan_link_order=0:exitcode=86:$common:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="exitcode=87:$common:${UBSAN_OPTIONS:-}"
export TSAN_OPTIONS="exitcode=88:second_deadlock_stack=1:suppressions=$root/scripts/tsan.supp:$common:${TSAN_OPTIONS:-}"
# Tests start `python -m loadgen` as subprocesses: they inherit both, so they too run the
# sanitized build.
export PYTHONPATH="$out/lib${PYTHONPATH:+:$PYTHONPATH}"
export LOADGEN_SANITIZER="$mode"

# From outside the repository: Python puts the working directory first on sys.path, and
# the source tree's loadgen/ would shadow the sanitized copy.
cd "$out"
tests=("${tests[@]/#/$root/}")
status=0
LD_PRELOAD="$runtime" "$PYTHON" - <<'PY' || status=$?
import os, loadgen._core as c
print("sanitize.sh: testing", c.__file__)
assert c.__file__.startswith(os.environ["PYTHONPATH"].split(":")[0]), "not the sanitized build"
PY
if [[ $status -eq 0 ]]; then
  LD_PRELOAD="$runtime" "$PYTHON" -m pytest -q -p no:cacheprovider "${tests[@]}" "$@" || status=$?
fi
if compgen -G "$reports/*" >/dev/null; then
  for f in "$reports"/*; do echo "==== $f" >&2; cat "$f" >&2; done
  echo "sanitize.sh: $mode found problems (reports above, kept in $reports)" >&2
  [[ $status -ne 0 ]] || status=1
fi
echo "sanitize.sh: $mode tests took $(($(date +%s) - built)) s, exit status $status"
exit $status
