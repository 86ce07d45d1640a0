"""Rules docs/DESIGN.md states about how loadgen's modules depend on one another, checked
on the source so that breaking one fails here: no module uses another's private names;
the engine does not import the network package; nothing uses grpcio's private API; the native threads' roles come from the
core's own table of the names they take; loadgen's Python threads have distinct names.

The tests that start processes or servers are in tests/integration/test_contracts.py."""

from __future__ import annotations

import ast
import os
import pathlib
import re
import threading
import time
from typing import List, Optional, Tuple

import pytest

from loadgen import _core
from loadgen.telemetry.host import ROLES

REPO = pathlib.Path(__file__).resolve().parents[2]  # the source tree (csrc/ too), installed or not
PACKAGE = REPO / "loadgen"

# Private names of the standard library and third-party packages that loadgen cannot do
# without. Each is someone else's, used where no public way exists.
FOREIGN_PRIVATE = {
    "_replace", "_asdict", "_fields", "_make",  # namedtuple's public API (urllib.parse results)
    "_getframe",  # sys._getframe: the MLPerf detail log names its caller's file and line
    "_option_string_actions",  # argparse: whether a parser already has a flag
}


def _package_files() -> List[pathlib.Path]:
    # protoc's generated modules (*_pb2.py) are not loadgen's code.
    return sorted(p for p in PACKAGE.rglob("*.py") if not p.name.endswith("_pb2.py"))


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


def _defined_names(tree: ast.AST) -> set:
    """Every name the file itself binds: definitions, assignments (to names and
    attributes), arguments and imports."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            out.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, (ast.Store, ast.Del)):
            out.add(n.attr)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
    return out


def _loadgen_module(node: ast.ImportFrom, filename: str) -> Optional[str]:
    """The dotted loadgen module ``node`` imports from (relative imports resolved), or
    None for another package."""
    if node.level:
        parts = pathlib.PurePosixPath(filename).with_suffix("").parts
        base = list(parts[: len(parts) - node.level])
        return ".".join(base + ([node.module] if node.module else []))
    if node.module and (node.module == "loadgen" or node.module.startswith("loadgen.")):
        return node.module
    return None


def _is_module(dotted: str, name: str, root: pathlib.Path) -> bool:
    """Whether ``dotted.name`` is a module file of the package (a package's own private
    module, like the extension ``loadgen._core``, is part of its layout, not a name)."""
    folder = root.joinpath(*dotted.split(".")[1:])
    # the stub counts too: a clean checkout has ``_core.pyi`` but builds the extension
    # into the installed copy, not beside the sources
    return (
        (folder / f"{name}.py").exists()
        or (folder / f"{name}.pyi").exists()
        or any(folder.glob(f"{name}.*.so"))
        or (folder / name).is_dir()
    )


def private_uses(source: str, filename: str, root: pathlib.Path = PACKAGE) -> List[str]:
    """Each use in ``source`` of a private name that the file does not define itself:
    ``from loadgen.x import _y``, ``something._y`` and ``getattr(something, "_y")``.
    ``filename`` is the file's path from the repository root (for relative imports)."""
    tree = ast.parse(source, filename=filename)
    defined = _defined_names(tree)
    found: List[Tuple[int, str]] = []
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom):
            module = _loadgen_module(n, filename)
            for a in n.names:
                if module and _is_private(a.name) and not _is_module(module, a.name, root):
                    found.append((n.lineno, f"imports {a.name} from {module}"))
        elif isinstance(n, ast.Attribute):
            if _is_private(n.attr) and n.attr not in defined and n.attr not in FOREIGN_PRIVATE:
                found.append((n.lineno, f"uses {ast.unparse(n)}"))
        elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr", "setattr")
              and len(n.args) >= 2 and isinstance(n.args[1], ast.Constant) and isinstance(n.args[1].value, str)):
            name = n.args[1].value
            if _is_private(name) and name not in defined and name not in FOREIGN_PRIVATE:
                found.append((n.lineno, f"uses {n.func.id}(..., {name!r})"))
    return [f"{filename}:{line}: {what}" for line, what in sorted(found)]


def test_the_private_name_checker_finds_planted_uses_and_passes_own_ones():
    sample = (
        "from loadgen import _core\n"
        "from loadgen.net.openai_stream import _loads_json, event_problem\n"
        "from .base import _hidden\n"
        "class A:\n"
        "    def __init__(self):\n"
        "        self._mine = 1\n"
        "    def run(self, inner, parts):\n"
        "        inner._checked(b'')\n"
        "        getattr(inner, '_head_only', False)\n"
        "        return self._mine, self._own(), parts._replace(path='/')\n"
        "    def _own(self):\n"
        "        return 0\n"
    )
    found = private_uses(sample, "loadgen/net/sample.py")
    assert [f.split(": ", 1)[1] for f in found] == [
        "imports _loads_json from loadgen.net.openai_stream",
        "imports _hidden from loadgen.net.base",
        "uses inner._checked",
        "uses getattr(..., '_head_only')",
    ], found
    assert private_uses("import os\nos._exit(0)\n", "loadgen/x.py") == ["loadgen/x.py:2: uses os._exit"]


def test_no_module_uses_another_modules_private_names():
    found = []
    for path in _package_files():
        found += private_uses(path.read_text(encoding="utf-8"), path.relative_to(REPO).as_posix())
    assert not found, "private names used across modules (make them public, with a docstring):\n" + "\n".join(found)


def _imported(node: ast.AST, module: str) -> List[str]:
    """The dotted names an ``import`` brings in, or a ``from module import ...`` (its
    module as given, resolved by the caller where relative): the module and each name."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    assert isinstance(node, ast.ImportFrom)
    return [module] + [f"{module}.{a.name}" for a in node.names]


#: grpcio's private API: its private modules (``grpc._channel``, ``grpc._cython``), its
#: core binding (``cygrpc``), a channel's call state and completion thread.
GRPC_PRIVATE = re.compile(r"\bgrpc\._|_cython|cygrpc|_call_state|_run_channel_spin_thread")


def grpc_private_uses(source: str, filename: str) -> List[str]:
    """Each import, name, attribute or name-like string (``importlib``, ``getattr``) in
    ``source`` that touches grpcio's private API (:data:`GRPC_PRIVATE`)."""
    found = []
    for n in ast.walk(ast.parse(source, filename=filename)):
        names: List[str] = []
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            names = _imported(n, getattr(n, "module", None) or "")
        elif isinstance(n, ast.Attribute):
            names = [ast.unparse(n)]
        elif isinstance(n, ast.Name):
            names = [n.id]
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"[\w.]+", n.value):
            names = [n.value]
        if any(GRPC_PRIVATE.search(x) for x in names):
            found.append(f"{filename}:{n.lineno}: {names[-1]}")
    return sorted(set(found), key=lambda f: int(f.split(":")[1]))


def test_the_grpc_private_api_checker_finds_planted_uses_and_passes_public_ones():
    planted = (
        "import grpc._channel as impl\n"
        "from grpc._cython import cygrpc\n"
        "from grpc import _common\n"
        "def hold(channel):\n"
        "    state = channel._call_state\n"
        "    spin = getattr(impl, '_run_channel_spin_thread')\n"
        "    binding = importlib.import_module('grpc._cython.cygrpc')\n"
        "    return grpc._server, getattr(channel, '_call_state', None)\n"
    )
    lines = [int(f.split(":")[1]) for f in grpc_private_uses(planted, "loadgen/net/x.py")]
    assert sorted(set(lines)) == [1, 2, 3, 5, 6, 7, 8], lines
    public = (
        "import grpc\n"
        "def call(target, data):\n"
        "    with grpc.insecure_channel(target) as ch:\n"
        "        f = ch.unary_unary('/inference.GRPCInferenceService/ModelInfer').future(data, timeout=1.0)\n"
        "        f.add_done_callback(print)\n"
        "    return grpc.aio.insecure_channel, grpc.StatusCode.OK, grpc.RpcError\n"
    )
    assert grpc_private_uses(public, "loadgen/net/x.py") == []


def test_no_module_uses_grpcios_private_api():
    found = []
    for path in _package_files():
        found += grpc_private_uses(path.read_text(encoding="utf-8"), path.relative_to(REPO).as_posix())
    assert not found, "grpcio's private API used (use its public API):\n" + "\n".join(found)


def net_imports(source: str, filename: str) -> List[str]:
    """Each import of ``loadgen.net`` (or a module under it) in ``source``, at any depth
    (a function-level import counts), and each string naming it (``importlib``)."""
    found = []
    for n in ast.walk(ast.parse(source, filename=filename)):
        names: List[str] = []
        if isinstance(n, ast.Import):
            names = _imported(n, "")
        elif isinstance(n, ast.ImportFrom):
            names = _imported(n, _loadgen_module(n, filename) or "")
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"loadgen\.net(\.\w+)*", n.value):
            names = [n.value]
        if any(x == "loadgen.net" or x.startswith("loadgen.net.") for x in names):
            found.append(f"{filename}:{n.lineno}")
    return found


def test_the_engine_imports_nothing_from_the_network_package():
    planted = "def start(self):\n    from loadgen.net.native import Checker\n    return Checker\n"
    assert net_imports(planted, "loadgen/engine/engine.py") == ["loadgen/engine/engine.py:2"]
    assert net_imports("from .. import net\n", "loadgen/engine/x.py") == ["loadgen/engine/x.py:1"]
    assert net_imports("from loadgen.sut import forms\nimport numpy\n", "loadgen/engine/x.py") == []
    found = []
    for path in sorted((PACKAGE / "engine").rglob("*.py")):
        found += net_imports(path.read_text(encoding="utf-8"), path.relative_to(REPO).as_posix())
    assert not found, "the engine imports the network package: " + ", ".join(found)


# ------------------------------------------------------------------ thread roles and names

def test_the_core_exports_the_roles_of_the_names_its_threads_take():
    roles = dict(_core.THREAD_ROLES)
    assert set(roles.values()) <= set(ROLES)
    assert roles["lg-http"] == roles["lg-grpc"] == "io" and roles["lg-issue"] == "issue"
    with pytest.raises(TypeError):
        _core.THREAD_ROLES["lg-new"] = "other"  # type: ignore[index]
    # The names are the constants of csrc/affinity.h, and every thread takes its name
    # from one of them (never a literal of its own).
    header = (REPO / "csrc" / "affinity.h").read_text(encoding="utf-8")
    constants = dict(re.findall(r'inline constexpr char (k\w+ThreadName)\[\] = "([^"]+)";', header))
    assert set(constants.values()) == set(roles)
    used = set()
    for path in sorted((REPO / "csrc").rglob("*.cc")):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r'(set_current_thread_name|enter_io_thread)\(\s*"', text), f"{path.name} names a thread by a literal"
        used |= set(re.findall(r"(?:set_current_thread_name|enter_io_thread)\((k\w+ThreadName)", text))
    assert used == set(constants)


def _native_thread_names(stop: threading.Event, seen: set) -> None:
    while not stop.is_set():
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/comm", encoding="utf-8") as f:
                    name = f.read().strip()
            except OSError:
                continue
            if name.startswith("lg-"):
                seen.add(name)
        time.sleep(0.005)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="thread names are read from /proc")
def test_the_engines_threads_are_named_from_the_table(tmp_path):
    from loadgen.engine import EngineSettings, run
    from loadgen.sut import FixedDelaySUT

    seen: set = set()
    stop = threading.Event()
    watcher = threading.Thread(target=_native_thread_names, args=(stop, seen), daemon=True)
    watcher.start()
    try:
        run(EngineSettings(mode="closed", concurrency=4, duration_s=0.5, interval_s=0.1,
                           record_requests=str(tmp_path / "r.jsonl")), FixedDelaySUT(1_000_000))
    finally:
        stop.set()
        watcher.join(5.0)
    assert {"lg-issue", "lg-monitor", "lg-sut", "lg-records"} <= seen <= set(_core.THREAD_ROLES), seen


def thread_names(source: str, filename: str) -> List[str]:
    """The name (an f-string as its template) each ``threading.Thread(...)`` in
    ``source`` is given; a thread without a name is reported as ``<unnamed>``."""
    out = []
    for n in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(n, ast.Call) and (ast.unparse(n.func) in ("threading.Thread", "Thread")):
            name = next((k.value for k in n.keywords if k.arg == "name"), None)
            if isinstance(name, ast.Constant):
                out.append(str(name.value))
            elif name is not None:
                out.append(ast.unparse(name))
            else:
                out.append(f"<unnamed> at {filename}:{n.lineno}")
    return out


def test_loadgens_python_threads_have_distinct_names():
    sample = ("import threading\nthreading.Thread(target=f, name='loadgen-a')\n"
              "threading.Thread(target=g, name=f'loadgen-b-{i}')\nthreading.Thread(target=h)\n")
    assert thread_names(sample, "s.py") == ["loadgen-a", "f'loadgen-b-{i}'", "<unnamed> at s.py:4"]
    names = []
    for path in _package_files():
        names += thread_names(path.read_text(encoding="utf-8"), path.relative_to(REPO).as_posix())
    assert names and not [n for n in names if n.startswith("<unnamed>")], names
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert all(n.strip("f'\"").startswith("loadgen-") for n in names), names
