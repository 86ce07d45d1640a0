"""``loadgen env``: what a person checks first in a new pod: the CPUs this process may
use (affinity and cgroup), NUMA nodes, SMT cores, GPUs and where they sit, and the
placement plan ``--pin auto`` would apply."""

from __future__ import annotations

import argparse
import json
import platform
import sys
from typing import Any, Dict, List

from loadgen import placement
from loadgen._version import __version__
from loadgen.cli.common import EXIT_OK, UsageError

__all__ = ["register", "environment_report", "native_clients"]


def register(sub: Any) -> Dict[str, Any]:
    """Adds ``env``; returns {name: (handler, known flags or None)}."""
    env = sub.add_parser("env", help="show the CPUs, NUMA nodes, GPUs and the --pin auto plan",
                         description="Prints the topology this process sees (usable CPUs from the "
                         "affinity and the cgroup cpuset, NUMA nodes, physical cores, GPUs and their "
                         "local CPUs), the placement plan that --pin auto would apply, and whether this build has "
                         "the native HTTP and gRPC clients.")
    env.add_argument("--pin", default="auto", metavar="auto|CPUS",
                     help="show the plan for --pin auto (default) or within these CPUs, like 2-5")
    env.add_argument("--json", action="store_true", help="print JSON instead of text")
    return {"env": (_cmd_env, None)}


def environment_report(pin: str = "auto") -> Dict[str, Any]:
    """The topology, the host and the plan as one dict (what ``loadgen env --json`` prints)."""
    within = None
    if pin != "auto":
        try:
            within = placement.parse_cpulist(pin)
        except ValueError as e:
            raise ValueError(f"--pin: {e} (give auto or CPUs like 2-5)") from None
    topo = placement.read_topology()
    plan = placement.make_plan(topo, within=within)
    return {
        "loadgen_version": __version__,
        "host": {"hostname": platform.node(), "kernel": platform.release(), "machine": platform.machine(),
                 "python": sys.version.split()[0], "cpu_model": _cpu_model(),
                 "cpu_governor": placement.cpu_governor()},
        "topology": topo.as_dict(),
        "plan": {"pin": pin, **plan.as_dict()},
        "native_clients": native_clients(),
    }


def native_clients() -> Dict[str, Any]:
    """Which protocols this build's native network client has: HTTP/1.1 (always built),
    gRPC (only when nghttp2 was found at build time) and TLS for both (only when OpenSSL
    was)."""
    from loadgen import _core

    grpc = bool(_core.grpc_client_available())
    tls = bool(_core.tls_available())
    return {"http": "http1" in _core.NetProtocol.__members__, "grpc": grpc,
            "nghttp2": _core.grpc_client_nghttp2_version() if grpc else None,
            "tls": tls, "openssl": _core.tls_library_version() if tls else None}


def _cpu_model() -> str:
    from loadgen.results.document import environment

    return str(environment()["cpu_model"])


def _lines(rep: Dict[str, Any]) -> List[str]:
    fmt = placement.format_cpulist
    h, t, p = rep["host"], rep["topology"], rep["plan"]
    lines = [
        f"host         {h['hostname']}, Linux {h['kernel']} {h['machine']}, Python {h['python']}, "
        f"loadgen {rep['loadgen_version']}",
        f"cpu          {h['cpu_model']}; governor {h['cpu_governor'] or 'not readable'}",
        f"usable cpus  {fmt(t['usable']) or 'none'} ({len(t['usable'])}; affinity {fmt(t['affinity'])}, "
        f"cgroup {fmt(t['cgroup_cpus']) if t['cgroup_cpus'] is not None else 'none'})",
        f"             cgroup cpuset from {t['cgroup_source']}",
        f"cores        {len(t['cores'])} physical: " + " ".join("[" + fmt(c) + "]" for c in t["cores"]),
    ]
    for node, cpus in t["numa_nodes"].items():
        lines.append(f"numa node {node}  cpus {fmt(cpus)}")
    if not t["gpus"]:
        lines.append(f"gpus         none seen ({t['gpu_note'] or 'NVML lists no device'})")
    for g in t["gpus"]:
        node = g["numa_node"] if g["numa_node"] is not None else "unknown"
        lines.append(f"gpu {g['index']}        {g['uuid']} at {g['pci_bus_id']}, NUMA node {node}, "
                     f"local cpus {fmt(g['local_cpus']) or 'unknown'}" + (f" ({g['note']})" if g["note"] else ""))
    n = rep["native_clients"]
    lines.append(f"native       HTTP client {'yes' if n['http'] else 'no'}, gRPC client "
                 + (f"yes (nghttp2 {n['nghttp2']})" if n["grpc"] else "no (built without nghttp2: grpcio instead)")
                 + ", TLS " + (f"yes ({n['openssl']})" if n["tls"] else "no (built without OpenSSL: https:// and "
                               "grpcs:// run on the Python clients)"))
    if p["ok"]:
        lines.append(f"plan (--pin {p['pin']})  issue thread cpu {fmt(p['issue_cpus'])}, dispatcher cpu "
                     f"{fmt(p['dispatcher_cpus'])}, in-process SUT cpus {fmt(p['sut_cpus']) or 'none left'}")
        lines.append(f"             {p['why']}")
    else:
        lines.append(f"plan (--pin {p['pin']})  none: {p['why']}")
    return lines


def _cmd_env(args: argparse.Namespace) -> int:
    try:
        rep = environment_report(args.pin)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.json:
        print(json.dumps(rep, indent=2))
    else:
        print("\n".join(_lines(rep)))
    return EXIT_OK
