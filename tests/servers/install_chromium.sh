#!/usr/bin/env bash
# Installs Debian's headless-capable Chromium for the HTML report tests
# (tests/servers/chromium.py), when `chromium` is not on PATH already.
#
#   tests/servers/install_chromium.sh
#
# Needs root and Debian's package lists (CI runs as root on Debian). Running it again
# when chromium is installed does nothing.
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
    echo "chromium is already installed: $(command -v chromium) ($(chromium --version 2>/dev/null || true))"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "cannot install chromium: no apt-get here; install Chromium and put 'chromium' on PATH" >&2
    exit 1
fi
start=$SECONDS
export DEBIAN_FRONTEND=noninteractive
echo "apt-get update"
apt-get update -qq >/dev/null
echo "apt-get install chromium"
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
chromium --version
echo "chromium installed in $((SECONDS - start)) s: $(command -v chromium)"
