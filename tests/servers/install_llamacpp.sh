#!/usr/bin/env bash
# Installs llama-cpp-python's OpenAI-compatible server into a virtual environment of its
# own, and writes the tiny random model it serves, for the real-server LLM test
# (tests/servers/llamacpp.py, tests/integration/test_servers_llamacpp.py).
#
#   tests/servers/install_llamacpp.sh DEST     e.g. tests/servers/install_llamacpp.sh .servers/llamacpp
#
# llama-cpp-python comes from PyPI as a source package: pip compiles llama.cpp for the CPU
# with cmake and a C++ compiler (several minutes on 2 cores; the built wheel is kept in
# pip's cache, so a second install takes seconds). Only the libraries the Python package
# loads are built (and llama.cpp's common library, which the package's build always
# adds): no llama.cpp tests, examples, tools, server binary or multimodal library, at -O1
# and without -march=native. The model (DEST/tiny-llama.gguf, about 1 MB) is written here by
# tiny_llama_gguf.py with the `gguf` package: random weights from a fixed seed, nothing
# downloaded.
#
# The virtual environment is made with the `python` on PATH. Running it again when DEST
# already holds this version and a model written by the current tiny_llama_gguf.py does
# nothing.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36
GGUF_VERSION=0.19.0

if [ "$#" -ne 1 ]; then
    echo "usage: $0 DEST" >&2
    exit 2
fi
dest=$1
here=$(cd "$(dirname "$0")" && pwd)
writer=$here/tiny_llama_gguf.py
model=$dest/tiny-llama.gguf
stamp=$dest/tiny-llama.sha256  # the writer that made the model
writer_sum=$(sha256sum "$writer" | cut -d' ' -f1)

installed_version() {
    "$dest/bin/python" -c 'from importlib.metadata import version; import llama_cpp.server.app; print(version("llama_cpp_python"))' 2>/dev/null || true
}

if [ -x "$dest/bin/python" ] && [ "$(installed_version)" = "$LLAMA_CPP_PYTHON_VERSION" ] \
    && [ -s "$model" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$writer_sum" ]; then
    echo "llama-cpp-python $LLAMA_CPP_PYTHON_VERSION and its model are already installed in $dest"
    exit 0
fi

# cmake and ninja come from PyPI into pip's build environment when they are missing here.
for tool in c++ cc; do
    if ! command -v "$tool" >/dev/null; then
        echo "$tool is not available: llama-cpp-python compiles llama.cpp from source (apt-get install g++)" >&2
        exit 1
    fi
done

start=$SECONDS
if [ "$(installed_version)" != "$LLAMA_CPP_PYTHON_VERSION" ]; then
    echo "Creating a virtual environment in $dest with $(command -v python) ($(python --version 2>&1))"
    rm -rf "$dest"
    python -m venv "$dest"
    echo "Installing llama-cpp-python[server]==$LLAMA_CPP_PYTHON_VERSION and gguf==$GGUF_VERSION into $dest" \
        "(compiles llama.cpp unless pip's cache has the wheel)"
    # -O1: the model is tiny, so a shorter compile matters more than faster kernels.
    CMAKE_ARGS="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
-DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=OFF '-DCMAKE_C_FLAGS_RELEASE=-O1 -DNDEBUG' '-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG'" \
    CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
        "$dest/bin/python" -m pip install --disable-pip-version-check --quiet \
        "llama-cpp-python[server]==$LLAMA_CPP_PYTHON_VERSION" "gguf==$GGUF_VERSION"
    if [ "$(installed_version)" != "$LLAMA_CPP_PYTHON_VERSION" ]; then
        echo "llama-cpp-python $LLAMA_CPP_PYTHON_VERSION does not import in $dest after pip install" >&2
        exit 1
    fi
    echo "llama-cpp-python installed ($((SECONDS - start)) s)"
fi

rm -f "$model" "$stamp"
"$dest/bin/python" "$writer" "$model.tmp"
mv "$model.tmp" "$model"
echo "$writer_sum" > "$stamp"
echo "llama-cpp-python $LLAMA_CPP_PYTHON_VERSION and $model ready in $dest ($((SECONDS - start)) s)"
