#!/usr/bin/env bash
# Fetches the Prometheus server of the distribution (Debian's `prometheus` package) for
# the live-metrics test (tests/integration/test_live_metrics.py), without installing it on the
# system: `apt-get download` in a temporary folder, then `dpkg-deb -x` into DEST.
#
#   tests/servers/install_prometheus.sh DEST     e.g. tests/servers/install_prometheus.sh .servers/prometheus
#
# The package's binary is a static-enough Go program that needs only libc; its other
# dependencies (the web console's JavaScript) are not needed to scrape and answer the
# HTTP API, so they are not fetched. Running it again when DEST already holds a working
# binary does nothing.
set -euo pipefail

if [ "$#" -ne 1 ]; then
    echo "usage: $0 DEST" >&2
    exit 2
fi
dest=$1
binary=$dest/usr/bin/prometheus

if [ -x "$binary" ] && "$binary" --version >/dev/null 2>&1; then
    echo "Prometheus is already installed in $dest: $("$binary" --version 2>&1 | head -n 1)"
    exit 0
fi

for tool in apt-get dpkg-deb; do
    if ! command -v "$tool" >/dev/null; then
        echo "$tool is not available: this script fetches Debian's prometheus package" >&2
        exit 1
    fi
done

start=$SECONDS
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "Downloading Debian's prometheus package into $tmp"
(cd "$tmp" && apt-get download prometheus)
deb=$(ls "$tmp"/prometheus_*.deb)
rm -rf "$dest"
mkdir -p "$dest"
dpkg-deb -x "$deb" "$dest"
"$binary" --version
echo "Prometheus installed in $dest ($((SECONDS - start)) s): $binary"
