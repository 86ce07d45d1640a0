"""Where loadgen's threads run: the CPUs this process may use, NUMA nodes, SMT siblings,
each GPU's local CPUs, and a placement plan for ``--pin auto``.

Everything is read from files (``/sys``, ``/proc``, the cgroup file system) under a
``root`` that tests point at fixture trees; NVML is asked only for GPU locality, and only
when it is there. Nothing here raises for a file that is missing or unreadable: the
topology says what it could not read.

For embedding::

    from loadgen import placement

    topo = placement.read_topology()
    plan = placement.make_plan(topo)
    with placement.pinned(plan.sut_cpus):   # this thread (say, a SUT worker) on the SUT's CPUs
        ...
"""

from __future__ import annotations

import contextlib
import os
import platform
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

__all__ = ["GpuLocality", "Plan", "Topology", "cpu_governor", "format_cpulist", "make_plan",
           "keep_off", "parse_cpulist", "pin_thread", "pinned", "read_topology", "thread_cpus"]

_MAX_CPU = 8191


def parse_cpulist(text: str) -> List[int]:
    """A Linux CPU list ('0-3,8,10-11', as in sysfs and cgroup files) as sorted CPU
    numbers; '' is the empty list. ValueError naming the bad item otherwise."""
    cpus: set[int] = set()
    for item in text.strip().split(","):
        item = item.strip()
        if not item:
            continue
        lo, sep, hi = item.partition("-")
        try:
            a, b = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(f"not a CPU list item: {item!r}") from None
        if a < 0 or b < a or b > _MAX_CPU:
            raise ValueError(f"not a CPU range: {item!r}")
        cpus.update(range(a, b + 1))
    return sorted(cpus)


def format_cpulist(cpus: Sequence[int]) -> str:
    """Sorted CPU numbers as a compact list ('0-3,8')."""
    out: List[str] = []
    items = sorted(set(cpus))
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        out.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(out)


def _read(root: str, path: str) -> Optional[str]:
    try:
        with open(os.path.join(root, path.lstrip("/")), encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


@dataclass
class GpuLocality:
    """Where a GPU sits: its PCI address, NUMA node (None when the firmware does not
    say: sysfs gives -1) and local CPUs, from sysfs and (when it answered) NVML."""

    index: int
    uuid: str
    pci_bus_id: str                         # sysfs form, like 0000:3b:00.0
    numa_node: Optional[int]
    local_cpus: List[int]                   # /sys/bus/pci/devices/<BDF>/local_cpulist
    nvml_cpus: Optional[List[int]] = None   # nvmlDeviceGetCpuAffinity
    note: str = ""                          # disagreements, what could not be read


@dataclass
class Topology:
    """The CPUs and NUMA layout this process sees."""

    affinity: List[int]                      # sched_getaffinity
    cgroup_cpus: Optional[List[int]]         # the cgroup's effective cpuset (None: not found)
    cgroup_source: str                       # which file it came from, or why none
    usable: List[int]                        # affinity and the cgroup's cpuset together
    numa_nodes: Dict[int, List[int]]         # node -> its CPUs
    cores: List[List[int]]                   # physical cores: groups of SMT siblings, usable CPUs only
    gpus: List[GpuLocality] = field(default_factory=list)
    gpu_note: str = ""

    def node_of(self, cpu: int) -> Optional[int]:
        """The NUMA node of ``cpu`` (None when unknown)."""
        for node, cpus in self.numa_nodes.items():
            if cpu in cpus:
                return node
        return None

    def as_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["numa_nodes"] = {str(k): v for k, v in self.numa_nodes.items()}
        return d


def _cgroup_cpus(root: str) -> Tuple[Optional[List[int]], str]:
    """The effective cpuset of this process's cgroup: v2 ``cpuset.cpus.effective`` of its
    own cgroup (walking up to the root of the hierarchy), else v1's ``cpuset.cpus``."""
    text = _read(root, "/proc/self/cgroup") or ""
    v2_path = v1_path = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2_path = parts[2]
        elif "cpuset" in parts[1].split(","):
            v1_path = parts[2]
    candidates: List[str] = []
    if v2_path is not None:
        rel = v2_path.strip("/")
        while True:
            candidates.append(os.path.join("/sys/fs/cgroup", rel, "cpuset.cpus.effective"))
            if not rel:
                break
            rel = os.path.dirname(rel)
    if v1_path is not None:
        for base in ("/sys/fs/cgroup/cpuset", "/sys/fs/cgroup/cpu,cpuset"):
            candidates.append(os.path.join(base, v1_path.strip("/"), "cpuset.effective_cpus"))
            candidates.append(os.path.join(base, v1_path.strip("/"), "cpuset.cpus"))
            candidates.append(os.path.join(base, "cpuset.cpus"))
    for path in candidates:
        value = _read(root, path)
        if value:
            try:
                return parse_cpulist(value), path
            except ValueError:
                continue
    return None, "no cpuset found (cgroup v2 cpuset controller off, or no cgroup file system)"


def _numa_nodes(root: str) -> Dict[int, List[int]]:
    base = os.path.join(root, "sys/devices/system/node")
    nodes: Dict[int, List[int]] = {}
    try:
        names = os.listdir(base)
    except OSError:
        return nodes
    for name in names:
        if name.startswith("node") and name[4:].isdigit():
            text = _read(root, f"/sys/devices/system/node/{name}/cpulist")
            if text is not None:
                try:
                    nodes[int(name[4:])] = parse_cpulist(text)
                except ValueError:
                    continue
    return dict(sorted(nodes.items()))


def _cores(root: str, usable: Sequence[int]) -> List[List[int]]:
    """Usable CPUs grouped by physical core (their SMT siblings)."""
    seen: Dict[Tuple[str, ...], List[int]] = {}
    for cpu in usable:
        sib = _read(root, f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        try:
            key = tuple(map(str, parse_cpulist(sib))) if sib else (str(cpu),)
        except ValueError:
            key = (str(cpu),)
        seen.setdefault(key, []).append(cpu)
    return sorted(seen.values(), key=lambda c: c[0])


def _nvml_bus_to_sysfs(bus_id: str) -> str:
    """NVML's '00000000:3B:00.0' as sysfs's '0000:3b:00.0'."""
    domain, _, rest = bus_id.partition(":")
    return f"{domain[-4:]}:{rest}".lower()


def _gpu_localities(root: str, gpus: Optional[Sequence[Dict[str, Any]]]) -> Tuple[List[GpuLocality], str]:
    """Each GPU's locality. ``gpus`` (tests, or a caller that asked NVML already): dicts
    with index, uuid, pci_bus_id and optionally nvml_cpus; None: ask NVML."""
    note = ""
    if gpus is None:
        gpus, note = _nvml_gpus()
    out = []
    for g in gpus:
        bdf = _nvml_bus_to_sysfs(str(g["pci_bus_id"])) if len(str(g["pci_bus_id"]).split(":")[0]) == 8 \
            else str(g["pci_bus_id"]).lower()
        node_text = _read(root, f"/sys/bus/pci/devices/{bdf}/numa_node")
        cpus_text = _read(root, f"/sys/bus/pci/devices/{bdf}/local_cpulist")
        node = int(node_text) if node_text and node_text.lstrip("-").isdigit() else None
        loc = GpuLocality(index=int(g["index"]), uuid=str(g["uuid"]), pci_bus_id=bdf,
                          numa_node=node if node is not None and node >= 0 else None,
                          local_cpus=parse_cpulist(cpus_text) if cpus_text else [],
                          nvml_cpus=g.get("nvml_cpus"))
        notes = []
        if cpus_text is None:
            notes.append(f"no /sys/bus/pci/devices/{bdf}/local_cpulist")
        if node is not None and node < 0:
            notes.append("the firmware gives no NUMA node (numa_node is -1)")
        if loc.nvml_cpus is not None and cpus_text is not None and sorted(loc.nvml_cpus) != loc.local_cpus:
            notes.append(f"NVML's CPU affinity {format_cpulist(loc.nvml_cpus)} differs from sysfs's "
                         f"{format_cpulist(loc.local_cpus)}")
        loc.note = "; ".join(notes)
        out.append(loc)
    return out, note


def _nvml_gpus() -> Tuple[List[Dict[str, Any]], str]:
    """index, uuid, PCI bus id and CPU affinity of every GPU NVML sees; ([], why) when
    NVML is not there."""
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py is not installed (pip install 'loadgen[gpu]')"
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return [], f"NVML is not available: {e}"
    try:
        out = []
        ncpu = os.cpu_count() or 1
        words = (ncpu + 63) // 64
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            bus = pynvml.nvmlDeviceGetPciInfo(h).busId
            mask = pynvml.nvmlDeviceGetCpuAffinity(h, words)
            cpus = [w * 64 + b for w, word in enumerate(mask) for b in range(64) if int(word) >> b & 1]
            out.append({"index": i, "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                        "pci_bus_id": bus.decode() if isinstance(bus, bytes) else bus, "nvml_cpus": cpus})
        return out, ""
    except Exception as e:
        return [], f"NVML failed: {e}"
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def read_topology(root: str = "/", gpus: Optional[Sequence[Dict[str, Any]]] = None,
                  affinity: Optional[Sequence[int]] = None) -> Topology:
    """The topology this process sees. ``root``, ``gpus`` and ``affinity`` are for tests:
    a fixture tree, GPUs as NVML would list them, and an affinity mask."""
    aff = sorted(affinity) if affinity is not None else sorted(os.sched_getaffinity(0))
    cg, source = _cgroup_cpus(root)
    usable = [c for c in aff if cg is None or c in cg]
    topo = Topology(affinity=aff, cgroup_cpus=cg, cgroup_source=source, usable=usable,
                    numa_nodes=_numa_nodes(root), cores=_cores(root, usable))
    topo.gpus, topo.gpu_note = _gpu_localities(root, gpus)
    return topo


def cpu_governor(root: str = "/", cpu: int = 0) -> Optional[str]:
    """The cpufreq governor of ``cpu`` (None where it cannot be read, as in most VMs)."""
    return _read(root, f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor")


def kernel() -> str:
    return platform.release()


# ----------------------------------------------------------------------------------- plan

@dataclass
class Plan:
    """Where loadgen's own threads go. ``ok`` False: no plan (``why`` says why) and
    nothing is pinned."""

    ok: bool
    why: str
    issue_cpus: List[int] = field(default_factory=list)       # the issue thread (C++)
    dispatcher_cpus: List[int] = field(default_factory=list)  # the dispatcher / event loop
    sut_cpus: List[int] = field(default_factory=list)         # left for an in-process SUT
    numa_node: Optional[int] = None
    from_cpus: List[int] = field(default_factory=list)        # what the plan chose from

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


def make_plan(topo: Topology, within: Optional[Sequence[int]] = None,
              gpu_indexes: Optional[Sequence[int]] = None) -> Plan:
    """The placement plan: the issue thread and the dispatcher on two separate physical
    cores (no SMT sibling shared), the rest of the usable CPUs for an in-process SUT; on
    the NUMA node of the GPUs being sampled when they share one and it has room.

    ``within``: only these CPUs (``--pin CPUS``). Never plans outside the usable set; on
    a machine with fewer than two usable physical cores it makes no plan and says why.
    """
    usable = [c for c in topo.usable if within is None or c in set(within)]
    if within is not None:
        outside = sorted(set(within) - set(topo.usable))
        if outside:
            return Plan(False, f"CPU {outside[0]} is not usable by this process "
                        f"(usable: {format_cpulist(topo.usable) or 'none'})")
    cores = [[c for c in core if c in usable] for core in topo.cores]
    cores = [core for core in cores if core]
    node, node_note = _gpu_node(topo, gpu_indexes)
    if node is not None:
        local = [core for core in cores if all(topo.node_of(c) == node for c in core)]
        if len(local) >= 2:
            cores = local
        else:
            node_note = f"NUMA node {node} of the GPUs has fewer than 2 usable physical cores; using all"
            node = None
    if len(cores) < 2:
        return Plan(False, f"too few CPUs for a plan: {len(cores)} usable physical core(s) "
                    f"({format_cpulist(usable) or 'none'}); the issue thread and the dispatcher need "
                    "two; nothing pinned", from_cpus=usable)
    # The highest-numbered cores: CPU 0 takes most interrupts and housekeeping.
    issue_core, dispatch_core = cores[-1], cores[-2]
    taken = set(issue_core) | set(dispatch_core)
    sut = [c for core in cores for c in core if c not in taken]
    why = "issue thread and dispatcher on separate physical cores" + (f" of NUMA node {node}" if node is not None
                                                                       else "")
    if not sut:
        why += "; no CPU is left for an in-process SUT (it shares theirs)"
    if node_note:
        why += f"; {node_note}"
    return Plan(True, why, issue_cpus=[issue_core[0]], dispatcher_cpus=[dispatch_core[0]], sut_cpus=sut,
                numa_node=node, from_cpus=sorted(c for core in cores for c in core))


def _gpu_node(topo: Topology, gpu_indexes: Optional[Sequence[int]]) -> Tuple[Optional[int], str]:
    gpus = [g for g in topo.gpus if gpu_indexes is None or g.index in gpu_indexes]
    nodes = {g.numa_node for g in gpus}
    if not gpus or nodes == {None}:
        return None, ""
    if len(nodes) > 1:
        return None, "the GPUs are on different NUMA nodes; not placing by GPU"
    return next(iter(nodes)), ""


# ---------------------------------------------------------------------------------- pinning

def thread_cpus() -> List[int]:
    """The CPUs the calling thread may run on."""
    return sorted(os.sched_getaffinity(0))


def pin_thread(cpus: Sequence[int]) -> None:
    """Pins the calling thread (only it: Linux affinity is per thread) to ``cpus``.
    ValueError naming a CPU this process may not use."""
    allowed = set(os.sched_getaffinity(0)) | set(_process_cpus())
    bad = [c for c in cpus if c not in allowed]
    if not cpus or bad:
        raise ValueError(f"cannot pin to CPU {bad[0] if bad else '(none)'}: usable CPUs are "
                         f"{format_cpulist(sorted(allowed))}")
    os.sched_setaffinity(0, list(cpus))


def keep_off(cpus: "frozenset[int] | set[int]") -> None:
    """Moves the calling thread off ``cpus`` (a sampler keeping away from a pinned,
    spinning issue thread); left as it is when no other CPU is allowed or on error."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return
    try:
        allowed = os.sched_getaffinity(0) - set(cpus)
        if allowed:
            os.sched_setaffinity(0, allowed)
    except OSError:
        pass


def _process_cpus() -> List[int]:
    try:
        return sorted(os.sched_getaffinity(os.getpid()))
    except OSError:
        return []


@contextlib.contextmanager
def pinned(cpus: Sequence[int]) -> Iterator[None]:
    """Runs the block with the calling thread pinned to ``cpus`` (a SUT worker, say),
    then restores its affinity. Empty ``cpus``: leaves the thread as it is."""
    if not cpus:
        yield
        return
    before = thread_cpus()
    pin_thread(cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
