#!/usr/bin/env bash
# Installs Triton's perf_analyzer, a peer of loadgen in bench/bench_http.py, into DEST:
#
#   bash tests/servers/install_perf_analyzer.sh DEST      # e.g. .servers/perf_analyzer
#
# then runs it as DEST/perf_analyzer ARGS. The perf-analyzer wheel ships one binary built
# for glibc 2.38 and GCC 13's libstdc++, newer than Debian 12's. It runs here through the
# dynamic loader and libraries of Debian 13 (trixie) packages unpacked into DEST:
#
#   DEST/wheel/          the wheel (pip install --target; its binary is perf_analyzer/bin/perf_analyzer)
#   DEST/apt/            a private apt configuration, state and cache (the .deb files stay)
#   DEST/runtime/        the unpacked packages: libc6 (the loader, libc, libm), libstdc++6,
#                        libgcc-s1, libssl3t64, zlib1g and libzstd1 (libcrypto's)
#   DEST/perf_analyzer   exec's the binary through runtime's loader with --library-path set
#                        to runtime's libraries alone, all arguments passed through
#
# Every library the binary needs (readelf -d: libz, libssl, libcrypto, libstdc++, libm,
# libgcc_s, libc and the loader) comes from runtime/, so nothing of the system's C runtime
# mixes with trixie's; the check below makes sure of that. Nothing is written outside DEST
# and pip's cache: apt runs with its own configuration file (APT_CONFIG), which reads none
# of /etc/apt and keeps its lists and cache under DEST/apt. Needs pip, apt-get and dpkg-deb.
# Idempotent: a DEST that already holds a working install is left as it is.
set -euo pipefail

PERF_ANALYZER_VERSION="2.60.0"
WHEEL_PLATFORM="manylinux_2_38_x86_64"
TRIXIE_SOURCE="deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main"
TRIXIE_PACKAGES=(libc6 libstdc++6 libgcc-s1 libssl3t64 zlib1g libzstd1)

if [[ $# -ne 1 ]]; then
    echo "usage: $0 DEST" >&2
    exit 2
fi
if [[ -d "$1" ]] && ls -A "$1" | grep -qvxE 'wheel|apt|runtime|perf_analyzer'; then
    echo "$1 holds files that are not this install's: not touching it" >&2
    exit 1
fi
mkdir -p "$1"
DEST="$(cd "$1" && pwd)"
WHEEL="$DEST/wheel"
BINARY="$WHEEL/perf_analyzer/bin/perf_analyzer"
APT="$DEST/apt"
RUNTIME="$DEST/runtime"
LIBS="$RUNTIME/usr/lib/x86_64-linux-gnu"
LOADER="$LIBS/ld-linux-x86-64.so.2"
WRAPPER="$DEST/perf_analyzer"

# Prints what is wrong with the install in DEST, if anything; non-zero when it is not usable.
check_install() {
    local problems=() resolved line
    [[ -d "$WHEEL/perf_analyzer-$PERF_ANALYZER_VERSION.dist-info" ]] ||
        problems+=("the perf-analyzer $PERF_ANALYZER_VERSION wheel is not in $WHEEL")
    [[ -x "$BINARY" ]] || problems+=("missing $BINARY")
    [[ -x "$LOADER" ]] || problems+=("missing the trixie loader $LOADER")
    [[ -x "$WRAPPER" ]] || problems+=("missing the wrapper $WRAPPER")
    if [[ -x "$BINARY" && -x "$LOADER" ]]; then
        # The loader's own trace of what it would load: every library found, and in DEST.
        if ! resolved=$("$LOADER" --library-path "$LIBS" --list "$BINARY" 2>&1); then
            problems+=("$LOADER --list $BINARY failed: $resolved")
        else
            while IFS= read -r line; do
                case "$line" in
                    *linux-vdso*) ;;
                    *"not found"*) problems+=("unresolved library: ${line//$'\t'/}") ;;
                    *"=> $RUNTIME/"*) ;;
                    *) problems+=("a library from outside $RUNTIME: ${line//$'\t'/}") ;;
                esac
            done <<< "$resolved"
        fi
    fi
    if [[ -x "$WRAPPER" && ${#problems[@]} -eq 0 ]]; then
        local usage
        usage=$("$WRAPPER" 2>&1 || true)  # no arguments: the usage text (exit status 99)
        [[ "$usage" == *"--concurrency-range"* ]] ||
            problems+=("$WRAPPER does not run: ${usage:0:300}")
    fi
    if [[ ${#problems[@]} -gt 0 ]]; then
        printf '%s\n' "${problems[@]}"
        return 1
    fi
    echo "perf_analyzer $PERF_ANALYZER_VERSION: $WRAPPER"
    echo "runs $BINARY through $LOADER with the libraries of $LIBS"
}

start=$SECONDS
if report=$(check_install 2>&1); then
    echo "perf_analyzer already installed in $DEST"
    echo "$report"
    exit 0
fi
if [[ -n "$(ls -A "$DEST")" ]]; then
    echo "the install in $DEST is incomplete, made anew:"
    echo "$report"
fi

if [[ ! -d "$WHEEL/perf_analyzer-$PERF_ANALYZER_VERSION.dist-info" ]]; then
    echo "installing the perf-analyzer $PERF_ANALYZER_VERSION wheel ($WHEEL_PLATFORM) into $WHEEL"
    rm -rf "$WHEEL"
    # --platform: the wheel's glibc 2.38 tag is newer than this system's, so pip would skip it.
    python -m pip install --disable-pip-version-check -q --no-deps --only-binary=:all: \
        --platform "$WHEEL_PLATFORM" --target "$WHEEL" "perf-analyzer==$PERF_ANALYZER_VERSION"
fi

# The install is not usable (the check above said why): the runtime is made anew.
echo "downloading ${TRIXIE_PACKAGES[*]} from Debian 13 (trixie) into $APT/debs"
rm -rf "$APT" "$RUNTIME"
mkdir -p "$APT/parts" "$APT/lists/partial" "$APT/cache/archives/partial" "$APT/debs"
: > "$APT/status"
echo "$TRIXIE_SOURCE" > "$APT/sources.list"
cat > "$APT/apt.conf" <<EOF
Dir::Etc::Main "/dev/null";
Dir::Etc::Parts "$APT/parts";
Dir::Etc::SourceList "$APT/sources.list";
Dir::Etc::SourceParts "$APT/parts";
Dir::Etc::Preferences "/dev/null";
Dir::Etc::PreferencesParts "$APT/parts";
Dir::State::Lists "$APT/lists";
Dir::State::status "$APT/status";
Dir::Cache "$APT/cache";
Acquire::Languages "none";
APT::Architectures { "amd64"; };
APT::Sandbox::User "root";
EOF
APT_CONFIG="$APT/apt.conf" apt-get -q -q update
(cd "$APT/debs" && APT_CONFIG="$APT/apt.conf" apt-get -q -q download "${TRIXIE_PACKAGES[@]}")
rm -rf "$APT/lists" "$APT/cache"  # about 140 MB of package lists, not needed any more
mkdir -p "$RUNTIME"
for deb in "$APT/debs"/*.deb; do
    echo "  unpacking $(basename "$deb")"
    dpkg-deb -x "$deb" "$RUNTIME"
done

cat > "$WRAPPER" <<EOF
#!/bin/sh
# perf_analyzer $PERF_ANALYZER_VERSION through the Debian 13 loader and libraries in $RUNTIME
# (written by tests/servers/install_perf_analyzer.sh). GCONV_PATH: trixie's iconv modules.
GCONV_PATH="$LIBS/gconv" exec "$LOADER" --library-path "$LIBS" --argv0 perf_analyzer "$BINARY" "\$@"
EOF
chmod +x "$WRAPPER"

if ! report=$(check_install 2>&1); then
    echo "the install in $DEST is not usable:" >&2
    echo "$report" >&2
    exit 1
fi
echo "$report"
echo "perf_analyzer installed in $DEST in $((SECONDS - start)) s"
