"""A mixed host under ``auto``: a busy guest left to the host scheduler must not break a gang.

Two 2-vCPU guests on the host's CPUs: a spin-barrier guest, which ``auto``
co-schedules, and a busy guest that gains nothing from it (one busy thread,
its second vCPU idle), which ``auto`` leaves to the host scheduler. The
barrier guest's hazard (a vCPU running while its sibling waits for a CPU) is
read from the daemon, in one run: with both guests under ``gang``, under
``auto``, and under ``auto`` with ``slot="false"`` (the busy guest not given
a slot of its own), the control that shows the hazard this test looks for.
From outside, cgroup freeze states show that the busy guest never runs
while the barrier guest does.
"""
from __future__ import annotations

import subprocess
import time

import pytest

from testbed import guests

from .conftest import PREFIX, DaemonProcess

BARRIER, BUSY = PREFIX + "mixed-barrier", PREFIX + "mixed-busy"
MEASURE = 6.0


def set_policy(name: str, xml: str) -> None:
    subprocess.run(["virsh", "-c", guests.URI, "metadata", name, "--uri", guests.NAMESPACE, "--key", "cosched",
                    "--set", xml, "--live"], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pair(libvirtd, guest_image):
    started = []
    for name, workload in ((BARRIER, "barrier"), (BUSY, "ep threads=1")):
        with guests.paused(started):
            g = guests.start(name, workload=workload, image=guest_image)
            started.append(g)
            g.wait_for("cosched-result")
    yield started
    for g in started:
        g.destroy()


def hazard(daemon: DaemonProcess, name: str, seconds: float) -> float:
    """The share of ``seconds`` in which the guest's hazard held, from the daemon's figures."""
    def figures():
        d = daemon.domain(name)
        return d["hazard_seconds"], d["observed_seconds"]
    h0, o0 = figures()
    time.sleep(seconds)
    h1, o1 = figures()
    return (h1 - h0) / max(o1 - o0, 1e-9)


def thawed_together(seconds: float) -> tuple[int, int]:
    """(samples, samples in which a vCPU of each guest was thawed, twice in a row)."""
    cgs = {n: sorted(guests.vcpu_cgroups(n)["v2"]) for n in (BARRIER, BUSY)}
    assert all(cgs.values()), f"no vCPU cgroups found: {cgs}"
    samples = both = 0
    prev = False
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        thawed = [any(open(f"{cg}/cgroup.events").read().split()[-1] == "0" for cg in files)
                  for files in cgs.values()]
        now = all(thawed)
        both += now and prev
        prev = now
        samples += 1
        time.sleep(0.0005)
    return samples, both


def test_a_busy_guest_left_to_the_host_no_longer_breaks_a_gang(pair, tmp_path):
    daemon = DaemonProcess(tmp_path).start()
    try:
        for name in (BARRIER, BUSY):                    # the reference: both guests take turns under gang
            set_policy(name, '<policy name="gang"/>')
        daemon.wait(lambda: any(sorted(c["members"]) == sorted([BARRIER, BUSY]) and c["mode"] == "freeze"
                                for c in daemon.status()["daemon"]["engine"]["cells"]), 10, "a gang of the two")
        time.sleep(1)
        ganged = hazard(daemon, BARRIER, MEASURE)

        set_policy(BARRIER, '<policy name="auto"/>')
        set_policy(BUSY, '<policy name="auto"/>')

        def composed():
            b, o = daemon.domain(BARRIER) or {}, daemon.domain(BUSY) or {}
            return b.get("mode") == "gang" and o.get("mode") == "none" and o.get("hosted")
        daemon.wait(composed, 30, "auto: the barrier guest in gang, the busy one in a slot of its own")
        time.sleep(1)
        protected = hazard(daemon, BARRIER, MEASURE)
        samples, both = thawed_together(3.0)
        explained = daemon.explain(BUSY)

        set_policy(BUSY, '<policy name="auto" slot="false"/>')
        daemon.wait(lambda: (daemon.domain(BUSY) or {}).get("hosted") is False, 10, "the busy guest free")
        time.sleep(1)
        free = hazard(daemon, BARRIER, MEASURE)
    finally:
        code = daemon.stop()
    print(f"\nbarrier guest hazard: both under gang {ganged:.3f}, auto {protected:.3f}, auto with the busy guest free "
          f"{free:.3f}; both thawed in {both} of {samples} samples")
    assert code == 0
    assert explained["hosted"] and [s["domain"] for c in explained["host"]["cells"] for s in c["slots"]] == [
        BARRIER, BUSY]
    assert both <= samples * 0.01, f"the busy guest ran in the gang's slot: {both} of {samples} samples"
    assert protected <= ganged + 0.05, f"hazard under auto {protected:.3f}, both under gang {ganged:.3f}"
    assert free >= protected + 0.05, f"control: a free busy guest left the hazard at {free:.3f}"
