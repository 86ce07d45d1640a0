"""Build of loadgen's native core, the extension module ``loadgen._core``.

Every C++ source under csrc/ (plain C++17, no Python; subfolders such as csrc/mlperf/
included) and in bindings/ (pybind11) is compiled into the one extension. Headers are
listed in ``depends`` so that editing one rebuilds.

The native gRPC client (csrc/grpc_client.cc) frames HTTP/2 with nghttp2: where its header
is found (Debian/Ubuntu: ``apt-get install libnghttp2-dev``; Fedora: ``nghttp2-devel``;
macOS: ``brew install nghttp2``) it is built in, else the build goes on without it and
the gRPC targets run on grpcio (``loadgen._core.grpc_client_available()`` says which).
LOADGEN_NGHTTP2=0 builds without it; LOADGEN_NGHTTP2=1 fails the build when it is missing.

TLS in the native clients (csrc/tls.cc, https:// and grpcs://) runs on OpenSSL, found the
same way (Debian/Ubuntu: ``apt-get install libssl-dev``; Fedora: ``openssl-devel``;
macOS: ``brew install openssl``) and linked with -lssl -lcrypto; without it TLS targets
run on the Python clients (``loadgen._core.tls_available()`` says which).
LOADGEN_OPENSSL=0 builds without it; LOADGEN_OPENSSL=1 fails the build when it is missing.
"""

import os
import shutil
import subprocess
from glob import glob

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension
from setuptools import setup

# The sources compile side by side, one per core (LOADGEN_BUILD_JOBS=N for N): build_ext's
# own --parallel only builds whole extensions side by side, and there is one.
ParallelCompile("LOADGEN_BUILD_JOBS", default=0).install()

sources = sorted(glob("csrc/**/*.cc", recursive=True)) + sorted(glob("bindings/*.cc"))
headers = sorted(glob("csrc/**/*.h", recursive=True)) + sorted(glob("bindings/*.h"))



def _find(package, header, prefixes=("/usr", "/usr/local", "/opt/homebrew")):
    """(include dirs, library dirs) of a pkg-config ``package`` whose ``header`` is found
    (pkg-config first, then the usual prefixes), or None."""
    if shutil.which("pkg-config"):
        try:
            cflags = subprocess.run(["pkg-config", "--cflags", package], capture_output=True, text=True, check=True)
            libs = subprocess.run(["pkg-config", "--libs-only-L", package], capture_output=True, text=True,
                                  check=True)
            inc = [f[2:] for f in cflags.stdout.split() if f.startswith("-I")]
            if any(os.path.exists(os.path.join(d, header)) for d in inc + ["/usr/include", "/usr/local/include"]):
                return inc, [f[2:] for f in libs.stdout.split() if f.startswith("-L")]
        except (OSError, subprocess.CalledProcessError):
            pass
    for prefix in prefixes:
        if os.path.exists(os.path.join(prefix, "include", header)):
            inc = [] if prefix == "/usr" else [os.path.join(prefix, "include")]
            return inc, [] if prefix == "/usr" else [os.path.join(prefix, "lib")]
    return None


def _nghttp2():
    """(include dirs, library dirs) of nghttp2, or None when its header is not found."""
    wanted = os.environ.get("LOADGEN_NGHTTP2", "auto")
    if wanted == "0":
        return None
    found = _find("libnghttp2", "nghttp2/nghttp2.h")
    if found is not None:
        return found
    if wanted == "1":
        raise SystemExit("LOADGEN_NGHTTP2=1: nghttp2's header (nghttp2/nghttp2.h) was not found; install "
                         "libnghttp2-dev (Debian/Ubuntu) or nghttp2-devel (Fedora)")
    print("loadgen: nghttp2's header not found: building without the native gRPC client "
          "(install libnghttp2-dev to have it)")
    return None


def _openssl():
    """(include dirs, library dirs) of OpenSSL, or None when its header is not found."""
    wanted = os.environ.get("LOADGEN_OPENSSL", "auto")
    if wanted == "0":
        return None
    found = _find("openssl", "openssl/ssl.h", ("/usr", "/usr/local", "/opt/homebrew/opt/openssl", "/opt/homebrew"))
    if found is not None:
        return found
    if wanted == "1":
        raise SystemExit("LOADGEN_OPENSSL=1: OpenSSL's header (openssl/ssl.h) was not found; install "
                         "libssl-dev (Debian/Ubuntu) or openssl-devel (Fedora)")
    print("loadgen: OpenSSL's header not found: building without TLS in the native clients "
          "(install libssl-dev to have it)")
    return None


nghttp2 = _nghttp2()
openssl = _openssl()
include_dirs, library_dirs, libraries, macros = ["csrc"], [], ["z"], []
if nghttp2 is not None:
    include_dirs += nghttp2[0]
    library_dirs += nghttp2[1]
    libraries.append("nghttp2")
    macros.append(("LOADGEN_HAVE_NGHTTP2", "1"))
if openssl is not None:
    include_dirs += openssl[0]
    library_dirs += openssl[1]
    libraries += ["ssl", "crypto"]
    macros.append(("LOADGEN_HAVE_OPENSSL", "1"))

ext = Pybind11Extension(
    "loadgen._core",
    sources,
    include_dirs=include_dirs,
    library_dirs=library_dirs,
    define_macros=macros,
    depends=headers,
    cxx_std=17,
    extra_compile_args=["-O3", "-Wall", "-Wextra", "-fvisibility=hidden"],
    libraries=libraries,
)

# Home-page as well as pyproject's Project-URLs: `pip show` before pip 25 reads only the
# older field (pyproject has no key for it). The license is pyproject's SPDX expression
# (License-Expression), which pip 25 and later show.
setup(ext_modules=[ext], url="https://github.com/loadgen-project/loadgen")
