#!/usr/bin/env bash
# Builds loadgen's wheel with the native gRPC and HTTP clients, installs it and checks it:
# the build steps of deploy/Dockerfile (which runs this script) and of CI, and the same on
# a Debian or Ubuntu machine outside Docker.
#
#   scripts/build_image.sh [--wheel-dir DIR] [--venv DIR] [--extras LIST] [--build-only | --install-only]
#
#   --wheel-dir DIR  where the wheel is written, or read from with --install-only (default: dist)
#   --venv DIR       install into this virtual environment (created when missing); without it,
#                    into the environment of $PYTHON (default python3), as in the image
#   --extras LIST    extras installed with the wheel, comma-separated (default: grpc; "" for none)
#   --build-only     system build packages and the wheel only (the image's builder stage)
#   --install-only   the runtime library and the wheel already in --wheel-dir only (its runtime stage)
#
# 1. System packages: to build, a C++17 compiler (g++), zlib's, nghttp2's and OpenSSL's
#    headers (zlib1g-dev, libnghttp2-dev, libssl-dev); to run, nghttp2's and OpenSSL's
#    shared libraries (libnghttp2-14, libssl3).
#    Missing ones are installed with apt-get when run as root, else named in an error.
# 2. Build: `pip wheel --no-deps` of the source tree with LOADGEN_NGHTTP2=1 and
#    LOADGEN_OPENSSL=1, so that the build fails without nghttp2 or OpenSSL rather than
#    leaving the native gRPC client or the native clients' TLS out. pip's
#    cache is used as configured (PIP_NO_CACHE_DIR=1 turns it off).
# 3. Install: that wheel with its dependencies and the extras, then `loadgen env --json`
#    of the installed package must report both native clients, with TLS.
set -euo pipefail

src="$(cd "$(dirname "$0")/.." && pwd)"
wheel_dir="dist"
venv=""
extras="grpc"
build=1
install=1
python="${PYTHON:-python3}"

# Bad usage: one line naming what was wrong, exit 2.
die() { echo "build_image.sh: $* (--help lists the options)" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --wheel-dir|--venv|--extras)
      [ $# -ge 2 ] || die "$1 needs a value"
      case "$1" in
        --wheel-dir) wheel_dir="$2" ;;
        --venv) venv="$2" ;;
        --extras) extras="$2" ;;
      esac
      shift 2 ;;
    --build-only) install=0; shift ;;
    --install-only) build=0; shift ;;
    -h|--help) sed -n '5,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument: $1" ;;
  esac
done
[ "$build$install" != "00" ] || die "--build-only and --install-only exclude each other"
[ -n "$wheel_dir" ] || die "--wheel-dir is empty"
mkdir -p "$wheel_dir"
wheel_dir="$(cd "$wheel_dir" && pwd)"

# Installs the Debian packages named that are not installed yet (apt-get, as root).
need_packages() {
  command -v dpkg-query >/dev/null || return 0  # not Debian: the build itself says what is missing
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  if [ "$(id -u)" != 0 ]; then
    echo "build_image.sh: missing system packages: ${missing[*]} (as root: apt-get install ${missing[*]})" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
  rm -rf /var/lib/apt/lists/*
}

if [ "$build" = 1 ]; then
  # Any C++17 compiler on the PATH will do; Debian's g++ where there is none.
  if command -v c++ >/dev/null || command -v g++ >/dev/null; then
    need_packages zlib1g-dev libnghttp2-dev libssl-dev
  else
    need_packages g++ zlib1g-dev libnghttp2-dev libssl-dev
  fi
  rm -f "$wheel_dir"/loadgen-*.whl
  # pip builds in an isolated environment with pyproject.toml's build requirements
  # (setuptools, pybind11); --no-deps: only loadgen's own wheel.
  LOADGEN_NGHTTP2=1 LOADGEN_OPENSSL=1 "$python" -m pip wheel --no-deps -w "$wheel_dir" "$src"
fi

if [ "$install" = 1 ]; then
  need_packages libnghttp2-14 libssl3
  wheels=("$wheel_dir"/loadgen-*.whl)
  [ -e "${wheels[0]}" ] || { echo "build_image.sh: no loadgen wheel in $wheel_dir" >&2; exit 1; }
  [ ${#wheels[@]} -eq 1 ] || { echo "build_image.sh: more than one loadgen wheel in $wheel_dir" >&2; exit 1; }
  if [ -n "$venv" ]; then
    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
    python="$venv/bin/python"
  fi
  "$python" -m pip install "${wheels[0]}${extras:+[$extras]}"
  # From an empty folder, so that a source tree in the current one cannot stand in for
  # the installed package.
  check_dir="$(mktemp -d)"
  trap 'rm -rf "$check_dir"' EXIT
  (cd "$check_dir" && "$python" -m loadgen env --json >env.json && "$python" - <<'EOF'
import json
import loadgen

native = json.load(open("env.json"))["native_clients"]
print(f"build_image.sh: loadgen {loadgen.__version__} in {loadgen.__path__[0]}; native clients: {native}")
if not (native["http"] and native["grpc"] and native["tls"]):
    raise SystemExit("build_image.sh: the installed loadgen lacks a native client or its TLS (HTTP, gRPC and TLS "
                     "all needed)")
EOF
  )
fi
