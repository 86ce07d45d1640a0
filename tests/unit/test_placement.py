"""loadgen.placement (topology from sysfs, /proc and cgroups; the --pin auto plan; pinning)
and loadgen.telemetry.host (per-role CPU, RSS, machine busy/steal), on fixture trees and
on this machine's real files.

The tests that start processes or servers are in tests/integration/test_placement.py."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from loadgen import placement
from loadgen.telemetry.host import HostSampler, read_machine_cpu, read_thread_cpu


def _write(root: Path, path: str, text: str) -> None:
    p = root / path.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text + "\n")


def _two_socket_tree(root: Path, cgroup: str = "v2") -> None:
    """2 NUMA nodes x 4 cores x 2 SMT threads: CPUs 0-7 node 0, 8-15 node 1; the sibling
    of CPU c is c ^ 4 within a node (0+4, 1+5, ...). A GPU on node 1."""
    for node, cpus in ((0, range(0, 8)), (1, range(8, 16))):
        _write(root, f"/sys/devices/system/node/node{node}/cpulist", f"{cpus[0]}-{cpus[-1]}")
    for c in range(16):
        base = (c // 8) * 8
        sib = sorted({c, base + ((c - base) ^ 4)})
        _write(root, f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list", ",".join(map(str, sib)))
    _write(root, "/sys/bus/pci/devices/0000:3b:00.0/numa_node", "1")
    _write(root, "/sys/bus/pci/devices/0000:3b:00.0/local_cpulist", "8-15")
    _write(root, "/sys/bus/pci/devices/0000:af:00.0/numa_node", "-1")
    _write(root, "/sys/bus/pci/devices/0000:af:00.0/local_cpulist", "0-15")
    if cgroup == "v2":
        _write(root, "/proc/self/cgroup", "0::/kubepods/pod1/ctr")
        _write(root, "/sys/fs/cgroup/kubepods/pod1/ctr/cpuset.cpus.effective", "2-15")
    else:
        _write(root, "/proc/self/cgroup", "4:cpuset:/docker/abc\n3:cpu,cpuacct:/docker/abc")
        _write(root, "/sys/fs/cgroup/cpuset/docker/abc/cpuset.cpus", "0-3,8-11")


GPU = {"index": 0, "uuid": "GPU-1111", "pci_bus_id": "00000000:3B:00.0", "nvml_cpus": list(range(8, 16))}


@pytest.mark.parametrize("text, cpus", [("0-3,8", [0, 1, 2, 3, 8]), ("", []), ("5", [5]), (" 1 , 3-4 ", [1, 3, 4])])
def test_cpulists_parse_and_format_back(text, cpus):
    assert placement.parse_cpulist(text) == cpus
    assert placement.parse_cpulist(placement.format_cpulist(cpus)) == cpus


@pytest.mark.parametrize("bad", ["a", "3-1", "-2", "1-99999"])
def test_bad_cpulists_name_the_item(bad):
    with pytest.raises(ValueError, match="CPU"):
        placement.parse_cpulist(bad)


def test_cgroup_v2_cpuset_narrows_the_affinity(tmp_path):
    _two_socket_tree(tmp_path, "v2")
    topo = placement.read_topology(str(tmp_path), gpus=[GPU], affinity=range(16))
    assert topo.cgroup_cpus == list(range(2, 16))
    assert topo.cgroup_source.endswith("kubepods/pod1/ctr/cpuset.cpus.effective")
    assert topo.usable == list(range(2, 16))
    assert topo.numa_nodes == {0: list(range(8)), 1: list(range(8, 16))}
    # Physical cores among the usable CPUs: CPU 2's sibling 6 is usable, 0 and 1 are not.
    assert [2, 6] in topo.cores and [8, 12] in topo.cores
    assert all(len(core) <= 2 for core in topo.cores)


def test_cgroup_v1_cpuset_is_read(tmp_path):
    _two_socket_tree(tmp_path, "v1")
    topo = placement.read_topology(str(tmp_path), gpus=[], affinity=range(16))
    assert topo.usable == [0, 1, 2, 3, 8, 9, 10, 11]


def test_gpu_locality_from_sysfs_and_nvml_agree_or_say_not(tmp_path):
    _two_socket_tree(tmp_path)
    far = {"index": 1, "uuid": "GPU-2222", "pci_bus_id": "00000000:AF:00.0", "nvml_cpus": [0, 1]}
    topo = placement.read_topology(str(tmp_path), gpus=[GPU, far], affinity=range(16))
    near, other = topo.gpus
    assert (near.pci_bus_id, near.numa_node, near.local_cpus, near.note) == ("0000:3b:00.0", 1, list(range(8, 16)), "")
    assert other.numa_node is None and "-1" in other.note and "differs" in other.note


def test_auto_plan_puts_issue_and_dispatcher_on_separate_cores_of_the_gpus_node(tmp_path):
    _two_socket_tree(tmp_path)
    topo = placement.read_topology(str(tmp_path), gpus=[GPU], affinity=range(16))
    plan = placement.make_plan(topo)
    assert plan.ok and plan.numa_node == 1
    (issue,), (disp,) = plan.issue_cpus, plan.dispatcher_cpus
    core_of = {c: tuple(core) for core in topo.cores for c in core}
    assert core_of[issue] != core_of[disp]  # no shared SMT sibling
    assert {issue, disp} <= set(range(8, 16))
    # The SUT gets the rest of the node, never the planned threads' cores.
    assert plan.sut_cpus and not set(plan.sut_cpus) & (set(core_of[issue]) | set(core_of[disp]))
    assert set(plan.sut_cpus) <= set(topo.usable)


def test_plan_within_given_cpus_and_refusals(tmp_path):
    _two_socket_tree(tmp_path)
    topo = placement.read_topology(str(tmp_path), gpus=[], affinity=range(16))
    plan = placement.make_plan(topo, within=[2, 3, 6, 7])
    assert plan.ok and set(plan.issue_cpus + plan.dispatcher_cpus) <= {2, 3, 6, 7}
    outside = placement.make_plan(topo, within=[0, 2])
    assert not outside.ok and "CPU 0 is not usable" in outside.why
    small = placement.make_plan(topo, within=[2, 6])  # one physical core (2 and its sibling 6)
    assert not small.ok and "too few CPUs" in small.why and not small.issue_cpus


def test_this_machines_topology_and_plan_stay_inside_the_affinity():
    topo = placement.read_topology()
    assert topo.usable and set(topo.usable) <= set(os.sched_getaffinity(0))
    plan = placement.make_plan(topo)
    if plan.ok:
        assert set(plan.issue_cpus + plan.dispatcher_cpus + plan.sut_cpus) <= set(topo.usable)
    else:
        assert "too few CPUs" in plan.why


def test_pinned_pins_only_the_calling_thread_and_restores_it():
    cpus = sorted(os.sched_getaffinity(0))
    seen = {}

    def worker():
        with placement.pinned(cpus[:1]):
            seen["inside"] = placement.thread_cpus()
            seen["main"] = sorted(os.sched_getaffinity(threading.main_thread().native_id))
        seen["after"] = placement.thread_cpus()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen["inside"] == cpus[:1]
    assert seen["main"] == cpus and seen["after"] == cpus
    with pytest.raises(ValueError, match="cannot pin to CPU 8191"):
        placement.pin_thread([8191])


# ------------------------------------------------------------------------------ host

def _fake_proc(root: Path, threads, machine):
    for tid, (name, ticks) in threads.items():
        fields = ["S"] + ["0"] * 10 + [str(ticks), "0"] + ["0"] * 30
        _write(root, f"/self/task/{tid}/stat", f"{tid} ({name}) " + " ".join(fields))
    _write(root, "/self/statm", "1000 250 0 0 0 0 0")
    total, idle, steal = machine
    _write(root, "/stat", f"cpu  {total - idle - steal} 0 0 {idle} 0 0 0 {steal} 0 0")


def test_host_intervals_split_cpu_by_role_from_proc_files(tmp_path):
    hz = os.sysconf("SC_CLK_TCK")
    pid = os.getpid()
    _fake_proc(tmp_path, {pid: ("python", 0), 11: ("lg-issue", 0), 12: ("x (y) z", 0), 13: ("lg-sut", 0)},
               (1000, 800, 0))
    sampler = HostSampler(1.0, dispatcher_tid=lambda: 12, proc=str(tmp_path))
    sampler.snapshot()
    # One "second" later: the issue thread used a full CPU, the dispatcher 95%, steal 10%.
    _fake_proc(tmp_path, {pid: ("python", hz // 10), 11: ("lg-issue", hz), 12: ("x (y) z", int(hz * 0.95)),
                          13: ("lg-sut", hz // 2)}, (2000, 1300, 100))
    sampler.snapshot()
    sampler._snaps[1].t_ns = sampler._snaps[0].t_ns + 1_000_000_000
    (iv,) = sampler.intervals()
    assert iv["cpu"]["issue"] == pytest.approx(1.0)
    assert iv["cpu"]["dispatcher"] == pytest.approx(0.95, abs=0.01)
    assert iv["cpu"]["native_sut"] == pytest.approx(0.5)
    assert iv["cpu"]["main"] == pytest.approx(0.1)
    assert iv["machine_busy"] == pytest.approx(0.5) and iv["machine_steal"] == pytest.approx(0.1)
    assert iv["rss_bytes"] == 250 * os.sysconf("SC_PAGE_SIZE")
    judged = sampler.report(event_loop=True)
    assert judged["saturated"] == [{"t_s": 0.0, "busy": pytest.approx(0.95, abs=0.01),
                                    "cpu": pytest.approx(0.95, abs=0.01), "run_queue": 0.0}]
    assert sampler.report(event_loop=False)["saturated"] == []


def test_an_event_loop_sharing_its_cpu_is_saturated_by_its_run_queue_wait(tmp_path):
    # On a busy node the loop ran half the time and waited for a CPU 45% of it: it always
    # had work, so it is saturated; with 10% of waiting it had room.
    hz = os.sysconf("SC_CLK_TCK")

    def judge(wait_ns):
        root = tmp_path / str(wait_ns)
        _fake_proc(root, {12: ("loop", 0)}, (1000, 800, 0))
        _write(root, "/self/task/12/schedstat", "0 0 0")
        sampler = HostSampler(1.0, dispatcher_tid=lambda: 12, proc=str(root))
        sampler.snapshot()
        _fake_proc(root, {12: ("loop", hz // 2)}, (2000, 1300, 0))
        _write(root, "/self/task/12/schedstat", f"500000000 {wait_ns} 100")
        sampler.snapshot()
        sampler._snaps[1].t_ns = sampler._snaps[0].t_ns + 1_000_000_000
        return sampler.report(event_loop=True)["saturated"]

    assert judge(450_000_000) == [{"t_s": 0.0, "busy": pytest.approx(0.95), "cpu": pytest.approx(0.5),
                                   "run_queue": pytest.approx(0.45)}]
    assert judge(100_000_000) == []


def test_host_sampler_on_this_process_sees_a_busy_named_thread():
    done = threading.Event()

    def spin():
        while not done.is_set():
            sum(i * i for i in range(10_000))

    t = threading.Thread(target=spin)
    sampler = HostSampler(0.2, dispatcher_tid=lambda: t.native_id)
    t.start()
    sampler.start()
    try:
        time.sleep(0.8)
        sampler.stop()  # its last sample while the thread still runs: an ended thread's CPU is gone from /proc
    finally:
        done.set()
        t.join()
    report = sampler.report(event_loop=False)
    assert report["cpu_s"].get("dispatcher", 0.0) > 0.1
    assert report["peak_rss_bytes"] > 1_000_000
    assert read_machine_cpu() is not None and os.getpid() in read_thread_cpu()


def test_the_engines_threads_name_themselves_and_the_dispatcher_is_pinned():
    import loadgen
    from loadgen.engine import Engine

    cpus = sorted(os.sched_getaffinity(0))
    seen = {}

    def sut(sample):  # names seen over the run: a thread names itself once it is scheduled
        seen.setdefault("names", set()).update(name for name, _ in read_thread_cpu().values())
        seen.setdefault("affinity", placement.thread_cpus())

    Engine(loadgen.EngineSettings(mode="constant", target_qps=200, duration_s=0.2,
                                  dispatcher_cpus=cpus[-1:]), sut).run()
    assert {"lg-issue", "lg-monitor"} <= seen["names"]
    assert seen["affinity"] == cpus[-1:]
    demo = Engine(loadgen.EngineSettings(mode="constant", target_qps=200, duration_s=0.3, sut_cpus=cpus[:1]),
                  loadgen.DemoSUT())
    demo.start()
    names, sut_affinity = set(), set()
    while not demo.wait(0.05):
        for tid, (name, _) in read_thread_cpu().items():
            names.add(name)
            if name == "lg-sut":
                sut_affinity.add(tuple(sorted(os.sched_getaffinity(tid))))
    assert "lg-sut" in names
    assert sut_affinity == {tuple(cpus[:1])}  # the demo SUT's thread runs on the SUT's CPUs


def test_loadgen_env_prints_the_topology_and_the_plan(capsys):
    import json

    from loadgen.cli import main

    assert main(["env"]) == 0
    text = capsys.readouterr().out
    assert "usable cpus" in text and "plan (--pin auto)" in text and "gpus" in text
    assert main(["env", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["topology"]["usable"] == sorted(os.sched_getaffinity(0))
    assert main(["env", "--pin", "nope"]) == 2


# ------------------------------------------------------------------- in a run


def test_the_run_plans_on_the_numa_node_of_the_gpus_it_samples(tmp_path):
    from loadgen.telemetry.gpu_select import parse_gpus
    from loadgen.telemetry.run import _selected_indexes

    _two_socket_tree(tmp_path)
    _write(tmp_path, "/sys/bus/pci/devices/0000:18:00.0/numa_node", "0")
    _write(tmp_path, "/sys/bus/pci/devices/0000:18:00.0/local_cpulist", "0-7")
    near0 = {"index": 1, "uuid": "GPU-0000-node0", "pci_bus_id": "00000000:18:00.0"}
    topo = placement.read_topology(str(tmp_path), gpus=[GPU, near0], affinity=range(16))
    for spec, node in (("1", 0), ("0", 1), ("GPU-0000", 0), ("all", None), ("none", None)):
        plan = placement.make_plan(topo, gpu_indexes=_selected_indexes(parse_gpus(spec), topo))
        assert plan.ok and plan.numa_node == node, (spec, plan)
