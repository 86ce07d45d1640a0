"""``--sut`` strings: which system under test a command line names."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from typing import Any

from loadgen.defaults import MAX_SUT_DELAY_US
from loadgen.sut.forms import DemoSUT, FixedDelaySUT, NullSUT, classify_sut

__all__ = ["SutSpecError", "is_network_sut", "load_sut"]

_DEMO_KEYS = {
    "workers": int, "max_batch": int, "service_us": float, "per_item_us": float,
    "sigma": float, "seed": int,
}


#: Each demo key's range (what the native SUT's 64-bit fields can hold, and sense).
_DEMO_RANGES = {
    "workers": (1, 4096, ""), "max_batch": (1, 1 << 20, ""),
    "service_us": (0, MAX_SUT_DELAY_US, " microseconds (1 h, the longest latency recorded)"),
    "per_item_us": (0, MAX_SUT_DELAY_US, " microseconds (1 h, the longest latency recorded)"),
    "sigma": (0, 3, ""), "seed": (0, 2**64 - 1, ""),
}


class SutSpecError(ValueError):
    """A ``--sut`` value that names no usable SUT; the message says what was looked for."""


def is_network_sut(spec: str) -> bool:
    """Whether a ``--sut`` value names a server (a URL, opened by :mod:`loadgen.net`)
    rather than an in-process SUT. The one place that decides it."""
    return "://" in spec


def load_sut(spec: str) -> Any:
    """The SUT a ``--sut`` value names.

    Forms: ``demo`` (optionally ``demo:workers=8,max_batch=16,service_us=1500``), ``null``,
    ``sleep:<us>``, ``python:MODULE:ATTR`` where MODULE is an importable module or a path
    to a ``.py`` file and ATTR a function, an async function, a batched SUT object, or a
    class of batched SUTs (instantiated without arguments).

    Raises:
        SutSpecError: the value is malformed or names nothing usable.
    """
    spec = spec.strip()
    kind, _, rest = spec.partition(":")
    if kind == "demo":
        return _demo(rest)
    if kind == "null" and not rest:
        return NullSUT()
    if kind == "sleep":
        try:
            delay = float(rest)
        except ValueError:
            raise SutSpecError(f"--sut {spec}: sleep needs a delay in microseconds, like sleep:500") from None
        if not 0 <= delay <= MAX_SUT_DELAY_US:
            raise SutSpecError(f"--sut {spec}: the delay must be in 0..{MAX_SUT_DELAY_US:g} microseconds "
                               "(1 h, the longest latency recorded)")
        return FixedDelaySUT(delay)
    if kind == "python":
        return _python(spec, rest)
    if is_network_sut(spec):
        raise SutSpecError(
            f"--sut {spec}: a server URL is opened with the run's options (loadgen run, or "
            "loadgen.net.open_target from Python), not by load_sut"
        )
    raise SutSpecError(
        f"--sut {spec!r} is not a SUT; use demo, null, sleep:<us> or python:MODULE:ATTR"
    )


def _demo(rest: str) -> DemoSUT:
    kwargs = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in _DEMO_KEYS:
            raise SutSpecError(
                f"--sut demo:{rest}: {item!r} is not KEY=VALUE with KEY one of {', '.join(_DEMO_KEYS)}"
            )
        try:
            kwargs[key] = _DEMO_KEYS[key](value)
        except ValueError:
            raise SutSpecError(f"--sut demo:{rest}: {key} must be a number, got {value!r}") from None
        lo, hi, what = _DEMO_RANGES[key]
        if not lo <= kwargs[key] <= hi:  # also false for nan
            allowed = f"an integer in {lo}..{hi}" if _DEMO_KEYS[key] is int else f"in {lo:g}..{hi:g}{what}"
            raise SutSpecError(f"--sut demo:{rest}: {key} must be {allowed}, got {value!r}")
    try:
        return DemoSUT(**kwargs)
    except ValueError as e:
        raise SutSpecError(f"--sut demo:{rest}: {e}") from None


def _python(spec: str, rest: str) -> Any:
    # A SUT's own code runs here (its module's top level, its class's constructor); a
    # sys.exit() in it would end the command quietly, with the exit status it chose.
    try:
        return _load_python(spec, rest)
    except SystemExit as e:
        raise SutSpecError(f"SUT {spec!r} called {_exit_call(e)} while loading") from None


def _exit_call(e: SystemExit) -> str:
    """How the SUT ended the process: ``sys.exit(0)``, ``sys.exit('message')``."""
    return f"sys.exit({'' if e.code is None else repr(e.code)})"


def _load_python(spec: str, rest: str) -> Any:
    module_name, sep, attr = rest.rpartition(":")
    if not sep or not module_name or not attr:
        raise SutSpecError(f"--sut {spec}: expected python:MODULE:ATTR (MODULE may be a file path)")
    if module_name.endswith(".py") or os.sep in module_name:
        path = os.path.abspath(module_name)
        if not os.path.isfile(path):
            raise SutSpecError(f"--sut {spec}: no such file {path}")
        name = "_loadgen_sut_" + os.path.splitext(os.path.basename(path))[0]
        loader_spec = importlib.util.spec_from_file_location(name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise SutSpecError(f"--sut {spec}: cannot load {path} as Python")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module
        sys.path.insert(0, os.path.dirname(path))
        try:
            loader_spec.loader.exec_module(module)
        except Exception as e:
            raise SutSpecError(f"--sut {spec}: importing {path} failed: {type(e).__name__}: {e}") from None
    else:
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            raise SutSpecError(
                f"--sut {spec}: no module named {e.name!r} (looked on sys.path, which includes the "
                f"current directory; give a file path like ./my_sut.py:{attr} instead)"
            ) from None
        except Exception as e:
            raise SutSpecError(f"--sut {spec}: importing {module_name} failed: {type(e).__name__}: {e}") from None
    try:
        target = getattr(module, attr)
    except AttributeError:
        public = sorted(n for n in dir(module) if not n.startswith("_"))[:12]
        raise SutSpecError(
            f"--sut {spec}: module {module_name} has no attribute {attr!r} (it has: {', '.join(public)})"
        ) from None
    if inspect.isclass(target):
        if not callable(getattr(target, "issue", None)):
            raise SutSpecError(f"--sut {spec}: class {attr} has no issue(batch) method")
        try:
            target = target()
        except Exception as e:
            raise SutSpecError(f"--sut {spec}: creating {attr}() failed: {type(e).__name__}: {e}") from None
    try:
        classify_sut(target)
    except ValueError as e:
        raise SutSpecError(f"--sut {spec}: {e}") from None
    return target
