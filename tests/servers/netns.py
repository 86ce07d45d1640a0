"""Network namespaces for the scale-out tests: each worker process in a namespace of its
own, with an address of its own, on a bridge in the root namespace where the server
listens, as pods on a node.

Everything is made by the test and named with its PID (two test sessions never share a
name), and removed in a ``finally``: the namespaces (which removes the veth ends inside
them, and so the pairs) and the bridge. Where namespaces cannot be made (not root, no
``ip``, no permission), workers run in the root namespace against 127.0.0.1 instead, and
the reason is kept.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Iterator, List, Optional

__all__ = ["Network", "worker_network"]


@dataclass
class Network:
    """Where the server listens and how each worker's command is started.

    Attributes:
        server_host: the address the server binds (the bridge's, or 127.0.0.1).
        prefixes: per worker, what goes before its command (``ip netns exec NS``, or
            nothing).
        addresses: per worker, its own address (None in the fallback).
        namespaces: per worker, its namespace's name (None in the fallback).
        fallback_reason: why there are no namespaces ("" when there are).
    """

    server_host: str
    prefixes: List[List[str]]
    addresses: List[Optional[str]]
    namespaces: List[Optional[str]] = field(default_factory=list)
    fallback_reason: str = ""
    _made: List[List[str]] = field(default_factory=list)


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")


def _subnet() -> str:
    return f"10.213.{os.getpid() % 250 + 1}"


def _make(net: Network, n: int) -> None:
    """Makes the bridge and ``n`` namespaces, noting in ``net._made`` how to remove each
    part as it is made (so that a failure half way removes what was made)."""
    tag = os.getpid() % 100000
    subnet = _subnet()
    bridge = f"lgmb{tag}"
    _ip("link", "add", bridge, "type", "bridge")
    net._made.append(["link", "del", bridge])
    _ip("addr", "add", f"{subnet}.1/24", "dev", bridge)
    _ip("link", "set", bridge, "up")
    for i in range(n):
        ns, host_end, ns_end = f"lg-w{i}-{tag}", f"lgm{i}h{tag}", f"lgm{i}n{tag}"
        _ip("netns", "add", ns)
        net._made.insert(0, ["netns", "del", ns])
        _ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
        net._made.insert(0, ["link", "del", host_end])
        _ip("link", "set", ns_end, "netns", ns)
        _ip("link", "set", host_end, "master", bridge)
        _ip("link", "set", host_end, "up")
        _ip("-n", ns, "addr", "add", f"{subnet}.{10 + i}/24", "dev", ns_end)
        _ip("-n", ns, "link", "set", ns_end, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        net.prefixes.append(["ip", "netns", "exec", ns])
        net.addresses.append(f"{subnet}.{10 + i}")
        net.namespaces.append(ns)


def _remove(made: List[List[str]]) -> None:
    for args in made:  # the newest first; a veth already gone with its namespace is fine
        subprocess.run(["ip", *args], capture_output=True, timeout=10)


@contextlib.contextmanager
def worker_network(n: int) -> Iterator[Network]:
    """``n`` worker namespaces on a bridge, removed on exit; or the 127.0.0.1 fallback."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        yield Network("127.0.0.1", [[] for _ in range(n)], [None] * n, [None] * n,
                      "network namespaces need root and the ip command")
        return
    net = Network(f"{_subnet()}.1", [], [])
    try:
        try:
            _make(net, n)
        except (OSError, subprocess.TimeoutExpired) as e:
            _remove(net._made)
            net._made.clear()
            yield Network("127.0.0.1", [[] for _ in range(n)], [None] * n, [None] * n,
                          f"cannot make namespaces: {e}")
            return
        yield net
    finally:
        _remove(net._made)
