#!/usr/bin/env bash
# Installs NVIDIA Triton Inference Server for the network tests: a venv at DEST holding
# nvidia-pytriton (whose wheel ships the `tritonserver` binary, its Python backend and one
# backend stub per Python version) and numpy<2 (the version the Python-backend stub's
# embedded interpreter is built for: it imports numpy from this venv).
#
#   bash tests/servers/install_triton.sh DEST        # e.g. .servers/triton
#
# tests/servers/triton.py starts the server from this venv. Nothing is written outside
# DEST and pip's cache; no system package is needed (the wheel bundles the server's
# libraries). The stub links libpython dynamically, so the `python` on PATH must be a
# shared-library build (pyenv: PYTHON_CONFIGURE_OPTS=--enable-shared); this is checked.
# Idempotent: a DEST that already holds a working install is left as it is.
set -euo pipefail

PYTRITON_VERSION="0.7.0"

if [[ $# -ne 1 ]]; then
    echo "usage: $0 DEST" >&2
    exit 2
fi
DEST="$1"

# Checks the install in DEST with its own interpreter; prints what is wrong and exits
# non-zero when it is not usable.
check_install() {
    "$DEST/bin/python" - "$PYTRITON_VERSION" <<'EOF'
import importlib.metadata as md
import os
import subprocess
import sys
import sysconfig

want = sys.argv[1]
problems = []
try:
    have = md.version("nvidia-pytriton")
    if have != want:
        problems.append(f"nvidia-pytriton is {have}, not {want}")
except md.PackageNotFoundError:
    problems.append("nvidia-pytriton is not installed")
try:
    if int(md.version("numpy").split(".")[0]) >= 2:
        problems.append(f"numpy is {md.version('numpy')}; the backend stub needs numpy<2")
except md.PackageNotFoundError:
    problems.append("numpy is not installed")

libdir = sysconfig.get_config_var("LIBDIR") or ""
ldlibrary = sysconfig.get_config_var("LDLIBRARY") or ""
if not sysconfig.get_config_var("Py_ENABLE_SHARED") or not os.path.exists(os.path.join(libdir, ldlibrary)):
    problems.append(f"{sys.executable} is not a shared-library build of Python (no libpython in "
                    f"{libdir!r}); the backend stub needs one")

dist = os.path.join(sysconfig.get_paths()["purelib"], "pytriton", "tritonserver")
server = os.path.join(dist, "bin", "tritonserver")
stub = os.path.join(dist, "python_backend_stubs", f"{sys.version_info[0]}.{sys.version_info[1]}",
                    "triton_python_backend_stub")
backend = os.path.join(dist, "backends", "python", "libtriton_python.so")
env = dict(os.environ, LD_LIBRARY_PATH=libdir)
for path in (server, stub, backend):
    if not os.path.exists(path):
        problems.append(f"missing {path}")
        continue
    ldd = subprocess.run(["ldd", path], env=env, capture_output=True, text=True)
    missing = [line.strip() for line in ldd.stdout.splitlines() if "not found" in line]
    if ldd.returncode != 0 or missing:
        problems.append(f"{path}: unresolved libraries {missing or ldd.stderr.strip()}")

if problems:
    print("\n".join(problems))
    sys.exit(1)
print(f"tritonserver: {server}")
print(f"stub for Python {sys.version_info[0]}.{sys.version_info[1]}: {stub}")
print(f"the server's environment needs PATH={os.path.join(sys.prefix, 'bin')}:$PATH "
      f"LD_LIBRARY_PATH={libdir}")
EOF
}

start=$SECONDS
if [[ -x "$DEST/bin/python" ]] && report=$(check_install 2>&1); then
    echo "Triton already installed in $DEST"
    echo "$report"
    exit 0
fi

if [[ -x "$DEST/bin/python" ]]; then
    echo "reusing the venv in $DEST"
elif [[ -e "$DEST" && -n "$(ls -A "$DEST")" ]]; then
    echo "$DEST exists, is not empty and is not a venv: not touching it" >&2
    exit 1
else
    echo "creating a venv in $DEST with $(command -v python) ($(python --version 2>&1))"
    python -m venv "$DEST"
fi

echo "installing nvidia-pytriton==$PYTRITON_VERSION and numpy<2 into $DEST"
"$DEST/bin/python" -m pip install --disable-pip-version-check -q \
    "nvidia-pytriton==$PYTRITON_VERSION" "numpy<2"

if ! report=$(check_install 2>&1); then
    echo "the install in $DEST is not usable:" >&2
    echo "$report" >&2
    exit 1
fi
echo "$report"
echo "Triton installed in $DEST in $((SECONDS - start)) s"
