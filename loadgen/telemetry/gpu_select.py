"""Which GPUs to sample: ``--gpus all|none|0,1|UUID,...`` and the environment.

:func:`parse_gpus` turns the option (and, for ``all``, ``CUDA_VISIBLE_DEVICES`` or
``NVIDIA_VISIBLE_DEVICES``) into a :class:`GpuSelection` without touching a GPU;
:func:`select` applies it to the devices the library sees.

- ``all`` (the default): every GPU NVML sees, narrowed by ``CUDA_VISIBLE_DEVICES`` when
  it is set (CUDA's rules: indexes, ``GPU-``/``MIG-`` UUIDs or unique prefixes of them;
  the list ends at the first entry that names no device; empty or ``-1`` means none),
  else by ``NVIDIA_VISIBLE_DEVICES`` (the container runtime's: ``all``; ``none``,
  ``void`` or empty mean none; UUIDs select; host indexes are already applied by the
  runtime, so NVML inside the container sees exactly those GPUs: all of them).
- ``none``: no GPU (the ``gpu`` section says ``unavailable``: "--gpus none").
- a list: NVML indexes (``nvidia-smi``'s order, which is PCI bus order and is not
  CUDA's default order) and UUIDs or unique UUID prefixes, comma-separated. An item that
  names no device is an error (ValueError naming it).

A GPU in MIG mode stands for its MIG devices: selecting it (by index or UUID) selects
all of them; a ``MIG-`` UUID selects one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence, Tuple

__all__ = ["DeviceInfo", "GpuSelection", "parse_gpus", "select"]

_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z][0-9A-Za-z-]*$", re.IGNORECASE)
_INDEX = re.compile(r"^[0-9]+$")
_WHOLE = -1  # a UUID match on the GPU itself, not one of its MIG devices


@dataclass(frozen=True)
class GpuSelection:
    """A parsed GPU selection.

    Attributes:
        mode: "all", "none" or "list".
        items: for "list": the indexes and UUIDs, as given.
        source: where it came from: "--gpus", "CUDA_VISIBLE_DEVICES" or
            "NVIDIA_VISIBLE_DEVICES".
        strict: an item naming no device is an error (``--gpus``); otherwise the list
            ends there, as CUDA reads its variable.
    """

    mode: str
    items: Tuple[str, ...] = ()
    source: str = "--gpus"
    strict: bool = True

    def describe(self) -> str:
        """One line: what was asked for and where it came from."""
        what = ",".join(self.items) if self.mode == "list" else self.mode
        return f"{self.source}={what}"


@dataclass(frozen=True)
class DeviceInfo:
    """A physical GPU as the library sees it: its index, UUID and, in MIG mode, the
    UUIDs of its MIG devices (slot order)."""

    index: int
    uuid: str
    mig_uuids: Tuple[str, ...] = ()
    mig: bool = False


def parse_gpus(spec: Optional[str] = "all", environ: Optional[Mapping[str, str]] = None) -> GpuSelection:
    """Parses a ``--gpus`` value (None means ``all``); ``all`` honours
    ``CUDA_VISIBLE_DEVICES`` then ``NVIDIA_VISIBLE_DEVICES`` from ``environ`` (no
    environment is read when it is None).

    Raises:
        ValueError: an item is neither an index nor a ``GPU-``/``MIG-`` UUID; the
            message names it.
    """
    text = "all" if spec is None else spec.strip()
    if text.lower() == "none":
        return GpuSelection("none")
    if text.lower() == "all":
        return _from_environment(environ or {})
    if not text:
        raise ValueError("--gpus: empty; give all, none, GPU indexes (0,1) or UUIDs (GPU-..., MIG-...)")
    items: List[str] = []
    for position, raw in enumerate(text.split(","), 1):
        item = raw.strip()
        if not item:
            raise ValueError(f"--gpus: item {position} of {text!r} is empty")
        if item.lower() in ("all", "none"):
            raise ValueError(f"--gpus: {item!r} cannot be part of a list ({text!r}); give it alone")
        if not (_INDEX.match(item) or _UUID.match(item)):
            raise ValueError(f"--gpus: {item!r} is not a GPU index (0, 1, ...) or a UUID (GPU-..., MIG-...)")
        if item not in items:
            items.append(item)
    return GpuSelection("list", tuple(items))


def _from_environment(environ: Mapping[str, str]) -> GpuSelection:
    cuda = environ.get("CUDA_VISIBLE_DEVICES")
    if cuda is not None:
        items: List[str] = []
        for raw in cuda.split(","):
            item = raw.strip()
            if not (_INDEX.match(item) or _UUID.match(item)):
                break  # CUDA ignores the rest of the list after an invalid entry
            items.append(item)
        if not items:
            return GpuSelection("none", source="CUDA_VISIBLE_DEVICES", strict=False)
        return GpuSelection("list", tuple(items), "CUDA_VISIBLE_DEVICES", strict=False)
    nvidia = environ.get("NVIDIA_VISIBLE_DEVICES")
    if nvidia is not None:
        value = nvidia.strip()
        if value.lower() in ("", "none", "void"):
            return GpuSelection("none", source="NVIDIA_VISIBLE_DEVICES", strict=False)
        uuids = tuple(i.strip() for i in value.split(",") if _UUID.match(i.strip()))
        if uuids:
            return GpuSelection("list", uuids, "NVIDIA_VISIBLE_DEVICES", strict=False)
        return GpuSelection("all", source="NVIDIA_VISIBLE_DEVICES", strict=False)
    return GpuSelection("all")


def select(selection: GpuSelection, devices: Sequence[DeviceInfo]) -> List[Tuple[int, Optional[int]]]:
    """The units to sample, in order and without repeats: (position in ``devices``,
    MIG slot or None for the whole GPU).

    Raises:
        ValueError: a strict selection names an index or UUID that no device has, or a
            UUID prefix that fits several; the message names the item and what exists.
    """
    if selection.mode == "none":
        return []
    if selection.mode == "all":
        return _dedupe([u for pos in range(len(devices)) for u in _units_of(devices, pos)])
    out: List[Tuple[int, Optional[int]]] = []
    for item in selection.items:
        try:
            out.extend(_resolve(item, devices))
        except LookupError as e:
            if selection.strict:
                raise ValueError(f"{selection.source}: {e}") from None
            break  # CUDA's rule: the list ends at the first entry that names no device
    return _dedupe(out)


def _units_of(devices: Sequence[DeviceInfo], pos: int) -> List[Tuple[int, Optional[int]]]:
    d = devices[pos]
    if d.mig:
        return [(pos, slot) for slot in range(len(d.mig_uuids))]
    return [(pos, None)]


def _resolve(item: str, devices: Sequence[DeviceInfo]) -> List[Tuple[int, Optional[int]]]:
    if _INDEX.match(item):
        index = int(item)
        for pos, d in enumerate(devices):
            if d.index == index:
                return _units_of(devices, pos)
        known = ", ".join(str(d.index) for d in devices) or "none"
        raise LookupError(f"no GPU has index {item} (indexes: {known})")
    want = item.lower()
    matches: List[Tuple[int, int]] = []  # (position, MIG slot or _WHOLE)
    for pos, d in enumerate(devices):
        if d.uuid.lower().startswith(want):
            matches.append((pos, _WHOLE))
        for slot, mig in enumerate(d.mig_uuids):
            if mig.lower().startswith(want):
                matches.append((pos, slot))
    exact = [m for m in matches if _uuid_of(devices, m).lower() == want]
    if len(exact) == 1 or len(matches) == 1:
        pos, slot = (exact or matches)[0]
        return _units_of(devices, pos) if slot == _WHOLE else [(pos, slot)]
    if matches:
        raise LookupError(f"{item!r} is a prefix of several UUIDs: "
                          + ", ".join(_uuid_of(devices, m) for m in matches))
    raise LookupError(f"no GPU or MIG device has UUID {item!r} (UUIDs: "
                      + (", ".join(d.uuid for d in devices) or "none") + ")")


def _uuid_of(devices: Sequence[DeviceInfo], match: Tuple[int, int]) -> str:
    pos, slot = match
    return devices[pos].uuid if slot == _WHOLE else devices[pos].mig_uuids[slot]


def _dedupe(units: List[Tuple[int, Optional[int]]]) -> List[Tuple[int, Optional[int]]]:
    seen = set()
    out = []
    for u in units:
        if u not in seen:
            seen.add(u)
            out.append(u)
    return out
