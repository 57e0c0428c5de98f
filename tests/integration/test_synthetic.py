"""Synthetic guests (``testbed.synthetic``) through the ``processes`` source, end to end.

Processes that look like QEMU to discovery, laid out in cgroups as libvirt
lays out a guest (both the plain and the systemd ``machine.slice`` layout),
their policy in a Proxmox VE style ``VMID.conf`` tag: found with the right
vCPU threads and cgroups, managed as a gang (frozen in turns, each vCPU
pinned through its affinity), and given back exactly as they were.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from cosched.kernel import parse_stat
from tests.support.soak import record
from testbed import synthetic

from .conftest import DaemonProcess

PREFIX = "cosched-it-syn-"


@pytest.fixture
def pve(tmp_path):
    return tmp_path / "pve"


@pytest.fixture
def started(tmp_path):
    gs: list[synthetic.SyntheticGuest] = []
    yield gs
    synthetic.destroy_all(gs)
    assert all(not os.path.exists(d) for g in gs for d in g.cgroups), "cgroups left behind"


def daemon_for(tmp_path, pve) -> DaemonProcess:
    return DaemonProcess(tmp_path, extra_config=f'sources = ["processes"]\npve_config_dir = "{pve}"\n'
                                                + synthetic.trust_config())


def state(gs):
    """Each vCPU thread's affinity and frozen state, as the kernel reports them."""
    v2 = synthetic.cgroup_mounts()[0]
    out = {}
    for g in gs:
        base = synthetic.guest_cgroup(g.layout, g.vmid, g.name)
        for i, tid in g.tids.items():
            frozen = open(f"{v2}{base}/vcpu{i}/cgroup.events").read().split()[-1]
            out[(g.name, i)] = (tuple(sorted(os.sched_getaffinity(tid))), frozen)
    return out


def test_both_layouts_are_found_with_their_threads_and_cgroups(tmp_path, pve, started, libvirtd):
    for layout in synthetic.LAYOUTS:
        started.append(synthetic.start(PREFIX + layout.replace(".", "-"), vcpus=3, layout=layout, pve_dir=str(pve),
                                       tags="cosched-none", workdir=tmp_path))
    daemon = daemon_for(tmp_path, pve).start()
    try:
        for g in started:
            d, _ = daemon.wait(lambda: daemon.domain(g.name), 5, f"{g.name} found")
            assert (d["uuid"], d["pid"], d["source"], d["policy"]) == (g.uuid, g.pid, "qemu", "none")
            assert {v["index"]: v["tid"] for v in d["vcpus"]} == g.tids
        metrics = daemon.metrics()
        assert all(f'cosched_vcpu_run_seconds_total{{domain="{g.name}",vcpu="2"}}' in metrics for g in started)
    finally:
        assert daemon.stop() == 0


def rt_runtimes(gs) -> dict[str, str]:
    """``cpu.rt_runtime_us`` along each vCPU's v1 cpu cgroup path (RT group scheduling kernels)."""
    cpu = synthetic.cgroup_mounts()[1]
    out = {}
    for g in gs:
        base = synthetic.guest_cgroup(g.layout, g.vmid, g.name)
        for path in (base.rsplit("/", 1)[0], base, *(f"{base}/vcpu{i}" for i in g.tids)):
            f = f"{cpu}{path}/cpu.rt_runtime_us"
            if os.path.exists(f):
                out[f] = open(f).read().strip()
    return out


def test_a_tagged_gang_rotates_pinned_and_is_given_back(tmp_path, pve, started, libvirtd):
    """A gang whose boosts the RT budget cannot hold (RT group scheduling: a
    boosted vCPU may hold 24% of a period here, a guest's turn is 50%) runs
    freeze-only, says so, and boosts no thread."""
    for n in range(2):
        started.append(synthetic.start(PREFIX + f"gang-{n}", vcpus=2, workload="barrier", pve_dir=str(pve),
                                       tags="cosched-gang-q20", workdir=tmp_path))
    before, rt_before = state(started), rt_runtimes(started)
    assert all(cpus == tuple(sorted(os.sched_getaffinity(0))) and frozen == "0" for cpus, frozen in before.values())
    daemon = daemon_for(tmp_path, pve).start()
    try:
        daemon.wait(lambda: daemon.status()["daemon"]["engine"]["switches"].get("gang", 0) > 20, 10, "rotating")
        d = daemon.domain(started[0].name)
        assert d["managed"] and d["params"]["quantum-ms"] == 20 and d["params"]["boost"] is True
        seen, policies = [], set()
        for _ in range(200):
            now = state(started)
            seen.append(tuple(sum(now[(g.name, i)][1] == "0" for i in g.tids) for g in started))
            policies |= {os.sched_getscheduler(tid) for g in started for tid in g.tids.values()}
            time.sleep(0.002)
        assert (2, 0) in seen and (0, 2) in seen, "no guest ran alone in its slot"
        cpu = synthetic.cgroup_mounts()[1]
        if cpu and os.path.exists(f"{cpu}/cpu.rt_runtime_us"):   # RT group scheduling: the budget cannot hold the boosts
            assert len(rt_before) == 1 + 3 * len(started), rt_before   # machine; each guest and its two vCPUs
            (cell,) = daemon.status()["daemon"]["engine"]["cells"]
            assert "freeze-only" in (cell["note"] or ""), cell
            assert policies == {os.SCHED_OTHER}, policies
        assert {now[k][0] for k in now} == {(0,), (1,)}, "vCPUs not pinned one per CPU"
        assert now[(started[0].name, 0)][0] != now[(started[0].name, 1)][0], "siblings share a CPU"
    finally:
        assert daemon.stop() == 0
    assert state(started) == before and rt_runtimes(started) == rt_before


CYCLES = int(os.environ.get("COSCHED_CYCLES", "20"))


def test_guests_coming_and_going_leak_nothing(tmp_path, pve, started, libvirtd):
    """``COSCHED_CYCLES`` guests (20 here, 1,000 in ``make soak``) each start,
    are taken into management and destroyed while two others rotate: no
    journal entry, cgroup or pinning outlives its guest, the daemon stays up
    and its memory flat."""
    import psutil

    from cosched.actuators.journal import Journal
    for n in range(2):
        started.append(synthetic.start(PREFIX + f"rot-{n}", vcpus=2, workload="barrier", pve_dir=str(pve),
                                       tags="cosched-gang-q20", workdir=tmp_path))
    before = state(started)
    daemon = DaemonProcess(tmp_path, extra_config=f'sources = ["processes"]\npve_config_dir = "{pve}"\n'
                                                  + synthetic.trust_config() + 'resync_interval_s = 0.2\n').start()
    try:
        daemon.wait(lambda: daemon.status()["daemon"]["engine"]["switches"].get("gang", 0) > 10, 10, "rotating")
        rss = []
        for n in range(CYCLES):
            tags = ("cosched-gang-q20", "cosched-relaxed", "cosched-none")[n % 3]
            g = synthetic.start(PREFIX + f"cycle-{n}", vcpus=2, workload="sleep", pve_dir=str(pve), tags=tags,
                                workdir=tmp_path, vmid=20000 + n)
            try:
                daemon.wait(lambda: (d := daemon.domain(g.name)) and (d["managed"] or tags == "cosched-none"), 10,
                            f"cycle {n}: {g.name} taken up")
            finally:
                synthetic.destroy_all([g])
            daemon.wait(lambda: daemon.domain(g.name) is None, 10, f"cycle {n}: {g.name} gone")
            rss.append(psutil.Process(daemon.proc.pid).memory_info().rss)
        switches = daemon.status()["daemon"]["engine"]["switches"].get("gang", 0)
        daemon.wait(lambda: daemon.status()["daemon"]["engine"]["switches"].get("gang", 0) > switches + 10, 5,
                    "still rotating")
        # the last guest's knobs go with the switcher's next plan, a moment after the
        # status stops listing it: a leak is an entry still there seconds later
        deadline = time.monotonic() + 5
        while True:
            entries = Journal(f"{daemon.state_dir}/journal.json").entries.values()
            owners = {e.get("name") or e.get("path") for e in entries}
            leaked = [o for o in owners if "cycle-" in str(o)]
            if not leaked or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        record("synthetic guests created and destroyed next to a rotation", cycles=CYCLES, leaks=len(leaked),
               exits=int(daemon.proc.poll() is not None),
               notes=f"daemon RSS {rss[CYCLES // 4] / 2**20:.0f} MiB after a quarter, {rss[-1] / 2**20:.0f} MiB at the end")
        assert not leaked, owners                                               # nothing of a gone guest
        assert daemon.proc.poll() is None
        if CYCLES >= 20:                                                       # after warm-up, flat
            assert rss[-1] < 1.1 * rss[CYCLES // 4], [r // 2**20 for r in rss]
    finally:
        assert daemon.stop() == 0
    assert state(started) == before


STARTER = """
import sys
from pathlib import Path
from testbed import synthetic
g = synthetic.start(sys.argv[1], vcpus=1, workload="spin", workdir=Path(sys.argv[2]))
print(g.pid, " ".join(g.cgroups), flush=True)
sys.stdin.read()          # killed here
"""


def alive(pid: str) -> bool:
    """Whether the process runs (a zombie waiting for its new parent to reap it does not)."""
    try:
        stat = parse_stat(open(f"/proc/{pid}/stat").read())
    except FileNotFoundError:
        return False
    return stat is not None and stat.state != "Z"


def test_a_synthetic_guest_dies_with_the_process_that_started_it(tmp_path, libvirtd):
    """A test killed by a signal must not leave a guest spinning on the host
    (the guest runs in a session of its own): its vCPU frozen too."""
    starter = subprocess.Popen([sys.executable, "-c", STARTER, PREFIX + "orphan", str(tmp_path)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    printed = starter.stdout.readline().split()
    assert len(printed) > 1, f"the starter printed no guest: {printed}"
    pid, *cgroups = printed
    v2 = synthetic.cgroup_mounts()[0]
    vcpu = next(d for d in cgroups if d.startswith(v2) and d.endswith("/vcpu0"))
    try:
        with open(f"{vcpu}/cgroup.freeze", "w") as f:
            f.write("1")
        starter.send_signal(signal.SIGKILL)
        starter.wait()
        deadline = time.monotonic() + 5
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(pid), f"guest {pid} outlived its starter"
    finally:
        if alive(pid):
            os.kill(int(pid), signal.SIGKILL)
        synthetic.remove_cgroups(cgroups)      # what a killed starter leaves behind
