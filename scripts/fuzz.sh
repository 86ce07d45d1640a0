#!/usr/bin/env bash
# Coverage-guided fuzzing of every parser that reads outside input, each for a bounded
# time. Fails (exit 1) when any target crashes; the crashing input is kept as
# build/fuzz/<target>/crash-* and the target's log is printed.
#
#   bash scripts/fuzz.sh                 every target, 20 s each
#   bash scripts/fuzz.sh 60 http1 sse    the named targets, 60 s each
#
# Targets (tests/fuzz/targets.py, run by tests/fuzz/fuzz_run.py under atheris with
# loadgen's modules instrumented): hdr_decode, hdrlog, http1, sse, sse_responses, kserve_json,
# options_config, options_env, prometheus, trace. And under libFuzzer with ASan and UBSan,
# built with clang++ when it is installed (else skipped, saying so): hdr_codec, the C++
# decoders of csrc/hdr_codec.cc (tests/fuzz/hdr_codec_fuzzer.cc), and http_parser, the
# native HTTP/1.1 response parser of csrc/http_parser.cc (tests/fuzz/http_parser_fuzzer.cc),
# and sse_scanner, the native SSE scanner of csrc/sse.cc and its read of non-streamed answers
# (tests/fuzz/sse_scanner_fuzzer.cc).
#
# Seed corpora are tests/fuzz/corpus/<target>/ (read only); what the fuzzer adds goes
# to build/fuzz/<target>/corpus/ and is reused by the next run. A crash found becomes a
# regression test in tests/unit/test_fuzz_regressions.py (plain pytest, no atheris).
#
# PYTHON (default: python) must import a built loadgen; atheris is installed with pip
# when missing. CLANGXX (default: clang++) builds the libFuzzer targets. Exit 2 when the
# Python targets cannot be listed (PYTHON fails to run tests/fuzz/fuzz_run.py --list).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
secs="${1:-20}"
shift || true
PYTHON="${PYTHON:-python}"
CLANGXX="${CLANGXX:-clang++}"
out="$root/build/fuzz"
mkdir -p "$out"

if ! "$PYTHON" -c "import atheris" 2>/dev/null; then
  "$PYTHON" -m pip install -q atheris
fi
# Outside the repository: from its root, Python would import the unbuilt source tree.
cd "$out"
if [[ $# -gt 0 ]]; then
  targets=("$@")
else
  # Not `mapfile < <(...)`: a failure there went unseen, and every Python target with it.
  if ! listing="$("$PYTHON" "$root/tests/fuzz/fuzz_run.py" --list)"; then
    echo "fuzz.sh: listing the Python fuzz targets failed ($PYTHON tests/fuzz/fuzz_run.py --list; see above)" >&2
    exit 2
  fi
  if [[ -z "$listing" ]]; then
    echo "fuzz.sh: $PYTHON tests/fuzz/fuzz_run.py --list named no target" >&2
    exit 2
  fi
  mapfile -t targets <<<"$listing"
  targets+=(hdr_codec http_parser sse_scanner)
fi

libfuzzer_args=(-max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1)
failed=()
start=$(date +%s)
for t in "${targets[@]}"; do
  dir="$out/$t"
  mkdir -p "$dir/corpus"
  rm -f "$dir"/crash-* "$dir"/timeout-* "$dir"/oom-* "$dir"/leak-*
  native=()  # a libFuzzer target: its sources, then the headers it depends on
  case "$t" in
    hdr_codec) native=(csrc/hdr_codec.cc csrc/hdr_histogram.cc csrc/hdr_codec.h csrc/hdr_histogram.h) ;;
    http_parser) native=(csrc/http_parser.cc csrc/http_parser.h) ;;
    sse_scanner) native=(csrc/sse.cc csrc/hdr_histogram.cc csrc/sse.h csrc/hdr_histogram.h) ;;
  esac
  if [[ ${#native[@]} -gt 0 ]]; then
    if ! command -v "$CLANGXX" >/dev/null; then
      echo "fuzz.sh: $t skipped: $CLANGXX is not installed"
      continue
    fi
    bin="$out/${t}_fuzzer"
    deps=("$root/tests/fuzz/${t}_fuzzer.cc" "${native[@]/#/$root/}")
    if [[ ! -x "$bin" || -n "$(find "${deps[@]}" -newer "$bin")" ]]; then
      srcs=()
      for f in "${deps[@]}"; do [[ "$f" == *.cc ]] && srcs+=("$f"); done
      "$CLANGXX" -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
        -I"$root/csrc" "${srcs[@]}" -lz -o "$bin"
    fi
    cmd=("$bin")
  else
    cmd=("$PYTHON" "$root/tests/fuzz/fuzz_run.py" "$t")
  fi
  t0=$(date +%s)
  status=0
  "${cmd[@]}" "${libfuzzer_args[@]}" -artifact_prefix="$dir/" "$dir/corpus" "$root/tests/fuzz/corpus/$t" \
    >"$dir/log" 2>&1 || status=$?
  runs="$(grep -Eo 'Done [0-9]+ runs' "$dir/log" | tail -1 || true)"
  if [[ $status -ne 0 ]]; then
    failed+=("$t")
    echo "fuzz.sh: $t CRASHED after $(($(date +%s) - t0)) s (exit $status); input kept in $dir:" >&2
    tail -40 "$dir/log" >&2
  else
    echo "fuzz.sh: $t clean: ${runs:-no run count}, $(($(date +%s) - t0)) s"
  fi
done
echo "fuzz.sh: ${#targets[@]} targets in $(($(date +%s) - start)) s"
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzz.sh: crashes in: ${failed[*]}" >&2
  exit 1
fi
