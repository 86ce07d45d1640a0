#!/usr/bin/env bash
# Installs Seldon MLServer into a virtual environment of its own, for the network tests
# (tests/servers/mlserver.py). It is kept apart from the test environment because its
# pins (pydantic, fastapi, protobuf, grpcio) must not change what the tests run against.
#
#   tests/servers/install_mlserver.sh DEST     e.g. tests/servers/install_mlserver.sh .servers/mlserver
#
# The virtual environment is made with the `python` on PATH. Running it again when DEST
# already holds this MLServer version does nothing.
set -euo pipefail

MLSERVER_VERSION=1.7.1

if [ "$#" -ne 1 ]; then
    echo "usage: $0 DEST" >&2
    exit 2
fi
dest=$1

if [ -x "$dest/bin/mlserver" ] \
    && [ "$("$dest/bin/python" -c 'from importlib.metadata import version; print(version("mlserver"))' 2>/dev/null)" = "$MLSERVER_VERSION" ]; then
    echo "MLServer $MLSERVER_VERSION is already installed in $dest"
    exit 0
fi

start=$SECONDS
echo "Creating a virtual environment in $dest with $(command -v python) ($(python --version 2>&1))"
python -m venv "$dest"
echo "Installing mlserver==$MLSERVER_VERSION into $dest"
"$dest/bin/python" -m pip install --disable-pip-version-check --quiet "mlserver==$MLSERVER_VERSION"
"$dest/bin/mlserver" --help >/dev/null
echo "MLServer $MLSERVER_VERSION installed in $dest ($((SECONDS - start)) s): $dest/bin/mlserver"
