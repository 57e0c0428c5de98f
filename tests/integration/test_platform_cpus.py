"""The platform's CPU decisions are inputs: a guest on a dedicated CPU is left alone.

A nova-shaped dedicated instance: a 1-vCPU guest pinned by its domain XML to
CPU 1 (``<cputune><vcpupin>``, as nova writes it for
``hw:cpu_policy=dedicated``), whose ``<nova:flavor>`` carries that extra spec
and ``cosched:policy`` ``gang``, runs beside two busy 2-vCPU guests that
``auto`` manages (``default_policy``). cosched leaves the pinned guest
alone (mode none, the reason in status, explain and the log), takes CPU 1 out
of its pool (so the two gang guests no longer fit it and are not managed),
and never freezes, re-pins or boosts the pinned guest; its pinning is what
the platform set, before, during, and after ``cosched reset``.

Then a guest the platform confines without pinning it (its cgroup cpuset
narrowed to CPU 1 under libvirt, as a KubeVirt pod's or a restricted
slice's): a 1-vCPU ``gang`` guest so confined takes its turns in the gang
cell on CPU 1, a 2-vCPU one does not fit there and is not managed (the
reason in status), and neither ever runs outside CPU 1.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import libvirt
import pytest

from testbed import guests

from .conftest import PREFIX, DaemonProcess
from .test_platforms import nova_metadata

DEDICATED = PREFIX + "cpus-dedicated"
GANG = [PREFIX + "cpus-gang-a", PREFIX + "cpus-gang-b"]


@pytest.fixture
def trio(libvirtd, guest_image):
    started = []
    with guests.paused(started):
        flavor = nova_metadata("m1.pinned", "gang").replace(
            "</nova:extraSpecs>", '<nova:extraSpec name="hw:cpu_policy">dedicated</nova:extraSpec></nova:extraSpecs>')
        started.append(guests.start(DEDICATED, vcpus=1, workload="ep", image=guest_image, policy=flavor,
                                    cputune="<cputune><vcpupin vcpu='0' cpuset='1'/></cputune>"))
        started[-1].wait_for("cosched-result")
    for name in GANG:
        with guests.paused(started):
            started.append(guests.start(name, workload="barrier", image=guest_image))
            started[-1].wait_for("cosched-result")
    yield started
    for g in started:
        g.destroy()


def state() -> tuple:
    dom = guests.connection().lookupByName(DEDICATED)
    (cg,) = guests.vcpu_cgroups(DEDICATED)["v2"]
    (tid,) = guests.vcpu_threads(DEDICATED)
    return (tuple(map(tuple, dom.vcpuPinInfo(libvirt.VIR_DOMAIN_AFFECT_LIVE))), open(f"{cg}/cgroup.freeze").read().strip(),
            os.sched_getscheduler(tid), tuple(sorted(os.sched_getaffinity(tid))))


def shared_affinities() -> set:
    return {tuple(sorted(os.sched_getaffinity(tid))) for name in GANG for tid in guests.vcpu_threads(name)}


def test_a_guest_on_a_dedicated_cpu_is_left_alone_and_its_cpu_leaves_the_pool(trio, tmp_path):
    before = state()
    assert before[0] == ((False, True),) and before[3] == (1,), before
    daemon = DaemonProcess(tmp_path, extra_config='default_policy = "auto"\n').start()
    try:
        daemon.wait(lambda: (daemon.domain(DEDICATED) or {}).get("left_alone"), 10, "the pinned guest left alone")
        seen, shared = set(), set()
        end = time.monotonic() + 4
        while time.monotonic() < end:
            seen.add(state())
            shared |= shared_affinities()
            time.sleep(0.05)
        pool = daemon.status()["daemon"]["engine"]["pool"]
        status = {d["name"]: d for d in daemon.status()["domains"]}
        explain = subprocess.run([sys.executable, "-m", "cosched", "explain", DEDICATED, "--config",
                                  str(daemon.config)], capture_output=True, text=True)
        log = daemon.log.read_text()
    finally:
        assert daemon.stop() == 0
    assert seen == {before}, seen                         # never re-pinned, frozen or boosted
    ded = status[DEDICATED]
    assert (ded["policy"], ded["policy_source"]) == ("gang", "extra-spec"), ded       # what the flavor asks for
    assert ded["mode"] == "none" and ded["left_alone"].startswith("dedicated CPUs") and not ded["managed"]
    for name in GANG:                                    # auto decides for them, within the pool CPU 1 left
        assert status[name]["policy"] == "auto" and not status[name]["left_alone"], status[name]
    assert pool == [0] and shared <= {(0, 1), (0,)}, (pool, shared)    # never pinned onto the dedicated CPU
    assert explain.returncode == 0 and "left alone" in explain.stdout and "dedicated CPUs" in explain.stdout
    assert f"domain={DEDICATED} action=left-alone reason='dedicated CPUs" in log
    subprocess.run([sys.executable, "-m", "cosched", "reset", "--config", str(daemon.config)], check=True,
                   capture_output=True)
    assert state() == before


ONE, TWO, SHARED = PREFIX + "cpus-one", PREFIX + "cpus-two", PREFIX + "cpus-shared"


@pytest.fixture
def confined(libvirtd, guest_image):
    started = []
    for name, vcpus in ((ONE, 1), (TWO, 2), (SHARED, 2)):
        with guests.paused(started):
            started.append(guests.start(name, vcpus=vcpus, workload="barrier", image=guest_image,
                                        policy=guests.annotation("gang")))
            started[-1].wait_for("cosched-result")
    guests.confine(ONE, "1")
    guests.confine(TWO, "1")
    yield started
    for g in started:
        g.destroy()


def outside(name: str) -> tuple:
    """Each vCPU thread's affinity and its cgroup.freeze, read from outside."""
    return tuple((tuple(sorted(os.sched_getaffinity(tid))), open(f"{cg}/cgroup.freeze").read().strip())
                 for tid, cg in zip(sorted(guests.vcpu_threads(name)), guests.vcpu_cgroups(name)["v2"]))


def test_a_guest_confined_by_its_cgroup_is_planned_inside_it_or_not_at_all(confined, tmp_path):
    before = {name: outside(name) for name in (ONE, TWO)}
    assert before == {ONE: (((1,), "0"),), TWO: (((1,), "0"), ((1,), "0"))}, before
    daemon = DaemonProcess(tmp_path).start()
    try:
        daemon.wait(lambda: (daemon.domain(ONE) or {}).get("managed") and (daemon.domain(SHARED) or {}).get("managed")
                    and "confines it" in ((daemon.domain(TWO) or {}).get("error") or ""), 15,
                    "the 1-vCPU guest in the gang cell, the 2-vCPU one refused")
        seen = {ONE: set(), TWO: set()}
        end = time.monotonic() + 4
        while time.monotonic() < end:
            for name in seen:
                seen[name].add(outside(name))
            time.sleep(0.02)
        status = {d["name"]: d for d in daemon.status()["domains"]}
        why = {name: daemon.explain(name) for name in (ONE, TWO)}
        text = subprocess.run([sys.executable, "-m", "cosched", "explain", TWO, "--config", str(daemon.config)],
                              capture_output=True, text=True)
    finally:
        assert daemon.stop() == 0
    assert why[ONE]["mode"] == "gang" and why[ONE]["why"].startswith("gang: takes its turn in cell gang"), why[ONE]
    assert why[TWO]["mode"] is None and "confines it" in why[TWO]["why"], why[TWO]
    assert text.returncode == 0 and "mode none (not managed) (policy gang)" in text.stdout, text.stdout + text.stderr
    assert {a for s in seen[ONE] for a, _ in s} == {(1,)}, seen[ONE]          # never outside CPU 1
    assert {f for s in seen[ONE] for _, f in s} == {"0", "1"}, seen[ONE]      # and taking its turns
    assert seen[TWO] == {before[TWO]}, seen[TWO]                               # never pinned nor frozen
    assert status[ONE]["mode"] == "gang" and status[ONE]["confined"] == {"0": [1]}, status[ONE]
    assert status[TWO]["mode"] is None and not status[TWO]["managed"], status[TWO]
    assert "vCPU 0 to CPU 1, vCPU 1 to CPU 1" in status[TWO]["error"] and "never pins" in status[TWO]["error"]
    assert {name: outside(name) for name in (ONE, TWO)} == before             # the daemon's stop put it all back
