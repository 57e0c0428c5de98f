"""Enforcement on real guests: gang, boost, relaxed and auto, and a clean host afterwards.

Three busy 2-vCPU guests (a spin-barrier loop) on the host's CPUs. Every
comparison is measured in the same run: one guest alone (the ideal), the
three under the host's own scheduler, then the three under ``gang``. The
watched modes (``boost``, ``relaxed``) and ``auto`` are judged from outside:
thread policies and cgroup freeze states sampled while the daemon runs.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import libvirt
import pytest

from cosched.actuators.admission import Admission
from cosched.hostfs import HostFS
from testbed import guests

from .conftest import PREFIX, DaemonProcess

NAMES = [PREFIX + f"gang-{c}" for c in "abc"]
SCHED_DEADLINE = 6        # not in Python's os module
MEASURE = 8.0


def set_policy(name: str, xml: str) -> None:
    subprocess.run(["virsh", "-c", "qemu:///system", "metadata", name, "--uri", "urn:cosched:libvirt:1",
                    "--key", "cosched", "--set", xml, "--live"], check=True, capture_output=True)


def vcpu_cgroups(name: str) -> list[str]:
    return sorted(guests.vcpu_cgroups(name)["v2"])


def host_state(names) -> dict:
    """Everything cosched may touch, as the kernel and libvirt report it now."""
    conn = guests.connection()
    state = {}
    for name in names:
        dom = conn.lookupByName(name)
        state[f"{name} pinning"] = dom.vcpuPinInfo(libvirt.VIR_DOMAIN_AFFECT_LIVE)
        for cg in vcpu_cgroups(name):
            state[f"{cg} frozen"] = open(f"{cg}/cgroup.events").read().split()[-1]
            state[f"{cg} freeze"] = open(f"{cg}/cgroup.freeze").read().strip()
            for tid in open(f"{cg}/cgroup.threads").read().split():
                state[f"{name} tid {tid} policy"] = (os.sched_getscheduler(int(tid)),
                                                     os.getpriority(os.PRIO_PROCESS, int(tid)))
                state[f"{name} tid {tid} affinity"] = sorted(os.sched_getaffinity(int(tid)))
        cpu_mount = guests.cgroup_mounts()[1]
        for cg in guests.vcpu_cgroups(name)["cpu"]:           # the RT runtime chain, vCPU up to the root
            while cg.startswith(cpu_mount):
                if os.path.exists(f"{cg}/cpu.rt_runtime_us"):
                    state[f"{cg}/cpu.rt_runtime_us"] = open(f"{cg}/cpu.rt_runtime_us").read().strip()
                cg = os.path.dirname(cg)
    return state


def annotate_all(gs, xml: str = '<policy name="gang"/>') -> dict:
    """Give every guest the same annotation; return the host state before any daemon acts on it."""
    for g in gs:
        set_policy(g.name, xml)
    return host_state(NAMES)


def crash_while_rotating(daemon: DaemonProcess) -> None:
    """Start the daemon, wait for a gang rotation, then SIGKILL daemon and switcher at once."""
    daemon.start()
    try:
        wait_gang(daemon, 3)
    finally:
        os.killpg(os.getpgid(daemon.proc.pid), signal.SIGKILL)
        daemon.proc.wait()


def throughputs(gs, seconds: float) -> dict[str, float]:
    since = {g.name: g.results()[-1]["t_ms"] for g in gs}
    time.sleep(seconds)
    return {g.name: guests.throughput(g.results(), since[g.name]) for g in gs}


@pytest.fixture(scope="module")
def trio(libvirtd, guest_image):
    """Three busy guests, no annotation (observed only), each booted alone and
    then paused, so no boot competes with a busy guest; a runs alone for the
    ideal, then all three run."""
    started = []
    for name in NAMES:
        g = guests.start(name, workload="barrier", image=guest_image)
        started.append(g)
        g.wait_for("cosched-result")
        g.dom.suspend()
    a = started[0]
    a.dom.resume()
    time.sleep(1)
    ideal = throughputs([a], MEASURE)[a.name]
    for g in started[1:]:
        g.dom.resume()
    time.sleep(1)
    yield started, ideal
    for g in started:
        g.destroy()


def alone(g, others) -> float:
    """Throughput of ``g`` with ``others`` paused."""
    for o in others:
        o.dom.suspend()
    try:
        time.sleep(1)
        return throughputs([g], MEASURE)[g.name]
    finally:
        for o in others:
            o.dom.resume()


def wait_gang(daemon, members: int | list[str], switches: int = 20, timeout: float = 20):
    """Wait until one gang cell of ``members`` (a count, or the guests' names) has made ``switches``."""
    def ready():
        s = daemon.status()
        cells = s["daemon"]["engine"]["cells"]
        return (cells and (len(cells[0]["members"]) == members if isinstance(members, int)
                           else sorted(cells[0]["members"]) == sorted(members))
                and s["daemon"]["engine"]["switches"].get("gang", 0) >= switches)
    daemon.wait(ready, timeout, f"a gang cell of {members} rotating")


def overlap_sampler(stop: threading.Event, out: list):
    """Count samples where two guests are thawed at once, in two passes in a row
    (one pass reads the files one after another, so a switch landing between two
    reads of a single pass is not an overlap)."""
    cgs = {n: vcpu_cgroups(n) for n in NAMES}
    prev = False
    samples = overlaps = 0
    while not stop.is_set():
        thawed = [n for n, files in cgs.items()
                  if any(open(f + "/cgroup.events").read().split()[-1] == "0" for f in files)]
        now = len(thawed) > 1
        overlaps += now and prev
        prev = now
        samples += 1
        time.sleep(0.0005)
    out.extend([samples, overlaps])


def test_gang_beats_cfs_never_overlaps_and_restores(trio, tmp_path):
    gs, ideal_before = trio
    before = host_state(NAMES)
    daemon = DaemonProcess(tmp_path).start()
    try:
        cfs = throughputs(gs, MEASURE)
        console_mark = {g.name: len(g.console()) for g in gs}
        annotate_all(gs)
        wait_gang(daemon, 3)
        gang = throughputs(gs, MEASURE)
        # sampled apart from the throughput window: the sampler itself needs CPU
        stop, result = threading.Event(), []
        sampler = threading.Thread(target=overlap_sampler, args=(stop, result))
        sampler.start()
        time.sleep(4.0)
        stop.set()
        sampler.join()
        status = daemon.status()
    finally:
        code = daemon.stop()
    after = host_state(NAMES)
    # the ideal again, with no daemon: the host's background load drifts over a run
    ideal_after = alone(gs[0], gs[1:])
    ideal = (ideal_before + ideal_after) / 2
    total_cfs, total_gang = sum(cfs.values()), sum(gang.values())
    print(f"\nideal {ideal:.0f}/s (before {ideal_before:.0f}, after {ideal_after:.0f})  cfs {total_cfs:.0f}/s {cfs}  gang {total_gang:.0f}/s {gang}  "
          f"overlap samples {result}  engine {status['daemon']['engine']}")
    assert code == 0
    samples, overlaps = result
    assert samples > 1000 and overlaps == 0, f"two guests thawed at once in {overlaps} of {samples} samples"
    # Over 17 runs of this test on the 2-CPU development host gang reached
    # 74-117% of the ideal, the ideal itself drifting up to 19% between its two
    # measurements. 60% keeps a margin and still fails a gang that does not
    # work (the host scheduler gives these guests 10-30%); 1.5x CFS below is
    # the comparison that decides, and the benchmark reports the figure.
    assert total_gang >= 0.6 * ideal, f"gang {total_gang:.0f}/s is under 60% of one guest alone ({ideal:.0f}/s)"
    assert total_gang >= 1.5 * total_cfs, f"gang {total_gang:.0f}/s is not 1.5x CFS ({total_cfs:.0f}/s)"
    for g in gs:
        assert "soft lockup" not in g.console()[console_mark[g.name]:], f"{g.name}: soft lockup under gang"
    assert after == before, "SIGTERM left the host changed"


def test_sigkill_then_reset_restores_the_host(trio, tmp_path):
    gs, _ = trio
    before = annotate_all(gs)
    daemon = DaemonProcess(tmp_path)
    crash_while_rotating(daemon)
    dirty = host_state(NAMES)
    assert dirty != before, "the daemon had changed nothing before it was killed"
    reset = subprocess.run([sys.executable, "-m", "cosched", "reset", "--config", str(daemon.config)],
                           capture_output=True, text=True)
    assert reset.returncode == 0, reset.stderr
    assert host_state(NAMES) == before
    again = subprocess.run([sys.executable, "-m", "cosched", "reset", "--config", str(daemon.config)],
                           capture_output=True, text=True)
    assert again.returncode == 0, "reset is idempotent"


def test_daemon_restarted_after_a_crash_restores_first(trio, tmp_path):
    gs, _ = trio
    before = annotate_all(gs)
    daemon = DaemonProcess(tmp_path)
    crash_while_rotating(daemon)
    annotate_all(gs, '<policy name="none"/>')
    daemon.start()                                    # same state directory and journal
    try:
        assert "action=recover" in daemon.log.read_text()
        assert host_state(NAMES) == before
    finally:
        assert daemon.stop() == 0


def test_dry_run_plans_but_changes_nothing(trio, tmp_path):
    gs, _ = trio
    before = annotate_all(gs)
    daemon = DaemonProcess(tmp_path).start("--dry-run")
    try:
        status, _ = daemon.wait(lambda: (s := daemon.status()) and s["daemon"]["engine"]["cells"] and s, 10, "a plan")
        assert status["daemon"]["dry_run"] is True
        assert len(status["daemon"]["engine"]["cells"][0]["members"]) == 3
        time.sleep(2)
        assert host_state(NAMES) == before
        assert daemon.status()["daemon"]["engine"]["switches"] == {}
    finally:
        assert daemon.stop() == 0


def test_reset_with_a_running_daemon_restores_and_pauses(trio, tmp_path):
    gs, _ = trio
    before = annotate_all(gs)
    daemon = DaemonProcess(tmp_path).start()
    try:
        wait_gang(daemon, 3)
        reset = subprocess.run([sys.executable, "-m", "cosched", "reset", "--config", str(daemon.config)],
                               capture_output=True, text=True)
        assert reset.returncode == 0, reset.stderr
        assert "running daemon" in reset.stdout
        assert host_state(NAMES) == before
        status = daemon.status()
        assert status["daemon"]["engine"]["paused"] is True
        time.sleep(2)                      # resyncs keep observing, never re-apply
        assert host_state(NAMES) == before
    finally:
        assert daemon.stop() == 0


def vcpu_tids(name: str) -> list[int]:
    return [int(t) for cg in vcpu_cgroups(name) for t in open(f"{cg}/cgroup.threads").read().split()]


def start_under(gs, preset: str, tmp_path) -> tuple[dict, DaemonProcess]:
    """Annotate every guest with ``preset``, start a daemon and wait until all run in that mode;
    return the host state from before, and the daemon."""
    before = annotate_all(gs, f'<policy name="{preset}"/>')
    daemon = DaemonProcess(tmp_path).start()
    try:
        daemon.wait(lambda: all((d := daemon.domain(g.name)) and d.get("mode") == preset for g in gs), 10,
                    f"guests under {preset}")
    except AssertionError:
        daemon.stop()
        raise
    return before, daemon


def watch_from_outside(seconds: float, names=NAMES) -> dict:
    """Sample, from outside the daemon, every vCPU's policy and freeze state:
    per guest, how many samples saw a vCPU under SCHED_DEADLINE, under
    SCHED_FIFO, saw one frozen, and saw all of them frozen in two passes in a row."""
    cgs = {n: vcpu_cgroups(n) for n in names if os.path.exists(f"/run/libvirt/qemu/{n}.pid")}
    tids = {n: vcpu_tids(n) for n in cgs}
    seen = {n: {"deadline": 0, "fifo": 0, "frozen": 0, "all_frozen": 0, "policies": {t: set() for t in tids[n]}}
            for n in cgs}
    prev_all = {n: False for n in cgs}
    samples = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for n in cgs:
            policies = {t: os.sched_getscheduler(t) for t in tids[n]}
            for t, p in policies.items():
                seen[n]["policies"][t].add(p)
            seen[n]["deadline"] += SCHED_DEADLINE in policies.values()
            seen[n]["fifo"] += os.SCHED_FIFO in policies.values()
            frozen = [open(f"{cg}/cgroup.events").read().split()[-1] == "1" for cg in cgs[n]]
            seen[n]["frozen"] += any(frozen)
            seen[n]["all_frozen"] += all(frozen) and prev_all[n]
            prev_all[n] = all(frozen)
        samples += 1
        time.sleep(0.0002)
    return {"samples": samples, **seen}


def test_boost_raises_waiting_siblings_then_restores_what_they_had(trio, tmp_path):
    """Boosts seen from outside, SCHED_DEADLINE and SCHED_FIFO; a vCPU the
    operator pinned to one CPU (no SCHED_DEADLINE for it) gets SCHED_FIFO
    only; every vCPU back as it was, pinning too."""
    gs, _ = trio
    batch_tid = vcpu_tids(gs[0].name)[1]
    os.sched_setscheduler(batch_tid, os.SCHED_BATCH, os.sched_param(0))   # a guest vCPU of the test's own
    os.setpriority(os.PRIO_PROCESS, batch_tid, 5)
    pinned_tid, pins = vcpu_tids(gs[1].name)[0], gs[1].dom.vcpuPinInfo(libvirt.VIR_DOMAIN_AFFECT_LIVE)
    gs[1].dom.pinVcpuFlags(0, tuple(cpu == 0 for cpu in range(len(pins[0]))), libvirt.VIR_DOMAIN_AFFECT_LIVE)
    try:
        before, daemon = start_under(gs, "boost", tmp_path)
        try:
            seen = watch_from_outside(4.0)
            rates = throughputs(gs, 4.0)
            status = daemon.status()
        finally:
            code = daemon.stop()
        after = host_state(NAMES)
        boosts = {d["name"]: sum(v["boosts"] for v in d["vcpus"]) for d in status["domains"] if d["name"] in NAMES}
        print(f"\nboost: outside {seen}  boosts {boosts}  rates {rates}")
        assert code == 0
        assert set(boosts) == set(NAMES) and all(n > 0 for n in boosts.values()), f"a guest was never boosted: {boosts}"
        assert sum(seen[n]["deadline"] for n in NAMES) > 0, "no vCPU was seen boosted from outside"
        assert sum(seen[n]["fifo"] for n in NAMES) > 0, "no SCHED_FIFO boost within a deadline boost's period seen"
        # a vCPU is frozen only for the instant of a return through the zero reservation: never co-stopped
        assert all(seen[n]["frozen"] <= seen["samples"] // 20 and seen[n]["all_frozen"] == 0 for n in NAMES), \
            "boost froze vCPUs for longer than a return"
        # the BATCH vCPU was boosted from, and returned to, BATCH: never to the default policy
        assert seen[gs[0].name]["policies"][batch_tid] <= {os.SCHED_BATCH, SCHED_DEADLINE, os.SCHED_FIFO}
        assert (os.sched_getscheduler(batch_tid), os.getpriority(os.PRIO_PROCESS, batch_tid)) == (os.SCHED_BATCH, 5)
        pinned = seen[gs[1].name]["policies"][pinned_tid]
        assert os.SCHED_FIFO in pinned and SCHED_DEADLINE not in pinned, f"pinned vCPU's policies: {pinned}"
        assert after == before, "the daemon left a thread boosted or something changed"
    finally:
        os.sched_setscheduler(batch_tid, os.SCHED_OTHER, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, batch_tid, 0)
        gs[1].dom.pinVcpuFlags(0, pins[0], libvirt.VIR_DOMAIN_AFFECT_LIVE)


def test_relaxed_costops_a_leader_never_every_sibling(trio, tmp_path):
    gs, _ = trio
    before, daemon = start_under(gs, "relaxed", tmp_path)
    try:
        seen = watch_from_outside(4.0)
        status = daemon.status()
    finally:
        code = daemon.stop()
    costops = {d["name"]: sum(v["costops"] for v in d["vcpus"]) for d in status["domains"] if d["name"] in NAMES}
    print(f"\nrelaxed: outside {seen}  costops {costops}")
    assert code == 0
    assert sum(costops.values()) > 0 and sum(seen[n]["frozen"] for n in NAMES) > 0, "nothing was co-stopped"
    assert all(seen[n]["all_frozen"] == 0 for n in NAMES), "every vCPU of a guest was frozen at once"
    assert host_state(NAMES) == before


def test_sigkill_under_relaxed_and_boost_then_reset_leaves_nothing(trio, tmp_path):
    gs, _ = trio
    before = annotate_all(gs, '<policy name="relaxed"/>')
    set_policy(gs[2].name, '<policy name="boost"/>')
    before = host_state(NAMES)
    daemon = DaemonProcess(tmp_path).start()
    try:
        daemon.wait(lambda: sum(v["costops"] + v["boosts"] for d in daemon.status()["domains"]
                                for v in d["vcpus"]) > 20, 10, "co-stops and boosts")
    finally:
        os.killpg(os.getpgid(daemon.proc.pid), signal.SIGKILL)
        daemon.proc.wait()
    journal = (Path(daemon.state_dir) / "journal.json").read_text()
    assert '"kind":"sched"' in journal.replace(" ", "") and '"kind":"freeze"' in journal.replace(" ", "")
    reset = subprocess.run([sys.executable, "-m", "cosched", "reset", "--config", str(daemon.config)],
                           capture_output=True, text=True)
    assert reset.returncode == 0, reset.stderr
    assert host_state(NAMES) == before
    # boosts returned while pinning went back can leave the kernel's deadline admission total wrong
    admission = Admission(HostFS("/"))
    try:
        assert admission.wrong() is False, "the kernel's deadline admission total is left wrong"
    finally:
        admission.close()


@pytest.fixture(scope="module")
def sleepers(trio, guest_image):
    """Two 2-vCPU guests whose vCPUs sleep between short chunks (booted with the trio paused)."""
    gs, _ = trio
    started = []
    with guests.paused(gs):
        for name in (PREFIX + "sleep-a", PREFIX + "sleep-b"):
            started.append(guests.start(name, workload="blocking", image=guest_image))
            started[-1].wait_for("cosched-result")
    yield started
    for g in started:
        g.destroy()


def test_auto_coschedules_barrier_guests_and_not_sleepers(trio, sleepers, tmp_path):
    """auto: the barrier guests end up in gang (turns: frozen most of the time),
    the sleepers in a mode without turns, never with both vCPUs frozen, and
    no guest changes its mode more than once."""
    gs, _ = trio
    annotate_all(gs, '<policy name="auto"/>')
    for g in sleepers:
        set_policy(g.name, '<policy name="auto"/>')
    daemon = DaemonProcess(tmp_path).start()
    try:
        def settled():
            modes = {g.name: (daemon.domain(g.name) or {}).get("mode") for g in gs + sleepers}
            return all(modes[g.name] in ("gang", "partial") for g in gs) and all(
                modes[g.name] in ("none", "boost", "relaxed") for g in sleepers) and modes
        modes, took = daemon.wait(settled, 30, "auto's choices")
        seen = watch_from_outside(3.0, [g.name for g in gs + sleepers])
        explain = subprocess.run([sys.executable, "-m", "cosched", "explain", gs[0].name, "--config",
                                  str(daemon.config)], capture_output=True, text=True)
        log = daemon.log.read_text()
    finally:
        code = daemon.stop()
    print(f"\nauto: modes {modes} after {took:.1f} s  outside {seen}\n{explain.stdout}")
    assert code == 0
    samples = seen["samples"]
    for g in gs:                        # in a rotation of three: frozen about two thirds of the time
        assert seen[g.name]["all_frozen"] > samples / 3, f"{g.name} is not taking turns: {seen[g.name]}"
    for g in sleepers:
        assert seen[g.name]["all_frozen"] == 0, f"{g.name} had every vCPU frozen: {seen[g.name]}"
    assert explain.returncode == 0 and "scores:" in explain.stdout and modes[gs[0].name] in explain.stdout
    assert f"domain={gs[0].name} action=mode old=none new={modes[gs[0].name]}" in log
    for g in gs + sleepers:                  # steady guests: one choice, kept (a sleeper once flapped)
        changed = [line for line in log.splitlines() if f"domain={g.name} action=mode " in line]
        assert len(changed) == (modes[g.name] != "none"), f"{g.name} changed mode:\n" + "\n".join(changed)


def test_guest_destroyed_mid_slot_is_harmless(trio, tmp_path):
    """Runs last: it destroys one of the module's guests, from outside, while
    the daemon manages it: two guests rotate in a gang, the third is under
    ``relaxed``, whose laggard boosts hold RT runtime on RT group scheduling
    kernels. That runtime goes back as the guest's QEMU exits, before libvirt
    removes its cgroups: a removed group holding runtime would keep counting
    against ``machine``, which could then not be restored."""
    gs, _ = trio
    annotate_all(gs[:2], '<policy name="gang" quantum-ms="100"/>')
    victim = gs[2]
    set_policy(victim.name, '<policy name="relaxed"/>')
    machine = "/sys/fs/cgroup/cpu/machine/cpu.rt_runtime_us"
    rt_group_sched = os.path.exists(machine)
    before = open(machine).read() if rt_group_sched else None
    daemon = DaemonProcess(tmp_path).start()
    try:
        wait_gang(daemon, [g.name for g in gs[:2]], switches=5)
        daemon.wait(lambda: (daemon.domain(victim.name) or {}).get("managed"), 10, "the relaxed guest managed")
        if rt_group_sched:
            assert open(machine).read() != before, "no RT runtime held: nothing to give back"
        # from the destroy on: a co-stop held to max_stall_ms before it (its laggard starved) is relaxed's
        mark = len(daemon.log.read_text())
        victim.destroy()
        daemon.wait(lambda: daemon.domain(victim.name) is None, 5, "the destroyed guest gone")
        alive = throughputs(gs[:2], 3.0)
        assert all(v > 0 for v in alive.values()), alive
        assert daemon.proc.poll() is None
        harm = [line for line in daemon.log.read_text()[mark:].splitlines()
                if "force-thawed" in line or "switcher-stalled" in line]
        assert not harm, harm
    finally:
        assert daemon.stop() == 0
    log = daemon.log.read_text()
    assert "was removed holding" not in log and "restored=all" in log, log[-3000:]
    if rt_group_sched:
        assert f"domain={victim.name} vcpu=" in log and "action=exited rt=given-back" in log, log[-3000:]
        assert open(machine).read() == before
    for name in NAMES[:2]:
        for cg in vcpu_cgroups(name):
            assert open(f"{cg}/cgroup.events").read().split()[-1] == "0"
