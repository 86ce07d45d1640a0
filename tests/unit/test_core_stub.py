"""The hand-written stub loadgen/_core.pyi must describe the native extension exactly,
and the package must ship its typing information."""

from __future__ import annotations

import ast
import enum
import inspect
import pathlib

import pytest

import loadgen
import loadgen._core as core

PACKAGE_DIR = pathlib.Path(loadgen.__file__).resolve().parent
STUB = PACKAGE_DIR / "_core.pyi"

# pybind11 adds these to every class or enum; they are not part of the API.
PYBIND11_INTERNALS = {"_pybind11_conduit_v1_", "name", "value", "__entries"}


def public(names) -> set:
    return {n for n in names if not (n.startswith("__") and n.endswith("__"))} - {
        "_pybind11_conduit_v1_"
    }


def parse_stub() -> ast.Module:
    return ast.parse(STUB.read_text(encoding="utf-8"), filename=str(STUB))


def stub_top_level() -> dict:
    """name -> ast node for each top-level class, function and annotated attribute
    (``record_dtype: ...``) of the stub."""
    out = {}
    for node in parse_stub().body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            out[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
    return out


def class_members(node: ast.ClassDef) -> set:
    names = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(item.name)
        elif isinstance(item, ast.Assign):
            names.update(t.id for t in item.targets if isinstance(t, ast.Name))
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
    return public(names)


def decorators(node: ast.FunctionDef) -> set:
    return {d.id for d in node.decorator_list if isinstance(d, ast.Name)}


def diff_message(what: str, in_stub: set, in_module: set) -> str:
    return (
        f"{what}: missing from the stub: {sorted(in_module - in_stub)}; "
        f"in the stub but not in the extension: {sorted(in_stub - in_module)}"
    )


def test_stub_file_is_present_next_to_the_extension():
    assert STUB.is_file(), f"{STUB} is missing"
    assert pathlib.Path(core.__file__).resolve().parent == PACKAGE_DIR
    parse_stub()  # valid Python syntax


def test_package_ships_py_typed_and_declares_it_as_package_data():
    assert (PACKAGE_DIR / "py.typed").is_file()
    pyproject = PACKAGE_DIR.parent / "pyproject.toml"
    if pyproject.is_file():  # source checkout: the wheel must carry both files
        text = pyproject.read_text(encoding="utf-8")
        assert "py.typed" in text and "*.pyi" in text


def test_stub_top_level_names_match_the_extension():
    in_stub = public(stub_top_level())
    in_module = public(dir(core))
    assert in_stub == in_module, diff_message("loadgen._core", in_stub, in_module)


def test_stub_classes_match_the_extension_kinds():
    for name, node in stub_top_level().items():
        obj = getattr(core, name, None)
        if obj is None:
            continue  # reported by the name comparison
        if isinstance(node, ast.ClassDef):
            assert inspect.isclass(obj), f"{name} is a class in the stub but not in the extension"
        elif isinstance(node, ast.AnnAssign):
            assert not callable(obj), f"{name} is an attribute in the stub"
        else:
            assert callable(obj) and not inspect.isclass(obj), f"{name} is a function in the stub"


def test_stub_hdr_decode_error_derives_from_value_error_in_both():
    node = stub_top_level()["HdrDecodeError"]
    bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
    assert bases == {"ValueError"}
    assert issubclass(core.HdrDecodeError, ValueError)
    assert loadgen.HdrDecodeError is core.HdrDecodeError


@pytest.mark.parametrize("name", ["HdrHistogram", "Recorder", "Engine", "MlperfRun", "NativeSutSettings",
                                  "NetClientSettings"])
def test_stub_class_members_match_the_extension(name):
    in_stub = class_members(stub_top_level()[name])
    in_module = public(dir(getattr(core, name)))
    assert in_stub == in_module, diff_message(name, in_stub, in_module)


@pytest.mark.parametrize("name", ["SutKind", "NetProtocol"])
def test_stub_enum_members_match_the_extension(name):
    in_stub = class_members(stub_top_level()[name])
    in_module = set(getattr(core, name).__members__)
    assert in_stub == in_module, diff_message(name, in_stub, in_module)


def test_the_recorder_is_bound_once_and_read_the_same_from_both_runs():
    """Engine and MlperfRun each hand out their Recorder, one bound type whose
    first-token histogram is ``ttft``; neither run binds the histograms itself."""
    assert inspect.isclass(core.Recorder)
    assert {"latency", "service_time", "issue_delay", "ttft", "tpot", "query_latency"} <= public(dir(core.Recorder))
    for run in (core.Engine, core.MlperfRun):
        assert isinstance(inspect.getattr_static(run, "recorder"), property)
        doubled = public(dir(run)) & {"latency", "ttft", "tpot", "issue_delay", "sample_latency",
                                      "first_token_latency", "time_per_output_token", "over_bound"}
        assert not doubled, f"{run.__name__} binds {sorted(doubled)} besides its recorder"


def test_stub_properties_static_methods_and_methods_are_declared_as_such():
    node = stub_top_level()["HdrHistogram"]
    wrong = []
    for item in node.body:
        if not isinstance(item, ast.FunctionDef) or item.name.startswith("__"):
            continue
        attr = inspect.getattr_static(core.HdrHistogram, item.name, None)
        if attr is None:
            continue  # reported by the member comparison
        deco = decorators(item)
        if isinstance(attr, property) != ("property" in deco):
            wrong.append(f"{item.name}: property mismatch")
        if isinstance(attr, staticmethod) != ("staticmethod" in deco):
            wrong.append(f"{item.name}: staticmethod mismatch")
    assert not wrong, wrong


def test_stub_record_mode_members_match_the_enum():
    node = stub_top_level()["RecordMode"]
    bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", None) for b in node.bases}
    assert "Enum" in bases
    in_stub = class_members(node)
    in_module = set(core.RecordMode.__members__)
    assert in_stub == in_module, diff_message("RecordMode", in_stub, in_module)
    extras = set(dir(core.RecordMode)) - set(dir(int)) - PYBIND11_INTERNALS - in_module
    extras = {n for n in extras if not (n.startswith("__") and n.endswith("__"))}
    assert not extras, f"RecordMode has undeclared attributes {sorted(extras)}"
    assert enum.Enum  # the stub models it as an enum.Enum


def test_stub_time_record_ns_parameters_match_the_extension_signature():
    node = stub_top_level()["time_record_ns"]
    stub_params = [a.arg for a in node.args.args]
    doc = core.time_record_ns.__doc__ or ""
    for p in stub_params:
        assert f"{p}:" in doc, f"parameter {p!r} of the stub is not in the extension's {doc!r}"


def test_every_name_in_loadgen_all_exists():
    missing = [n for n in loadgen.__all__ if not hasattr(loadgen, n)]
    assert not missing, f"loadgen.__all__ names missing attributes: {missing}"
    assert len(set(loadgen.__all__)) == len(loadgen.__all__)
