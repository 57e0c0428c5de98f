"""A mixed host under ``auto``: a busy guest left to the host scheduler must not break a gang.

Three 2-vCPU guests on the host's CPUs: a spin-barrier guest, which ``auto``
co-schedules, and two busy guests that gain nothing from it (one busy thread
each, the second vCPU idle), which ``auto`` leaves to the host scheduler and
hosts in the rotation, in one turn they share. The barrier guest's hazard (a
vCPU running while its sibling waits for a CPU) is read from the daemon, in
one run: with all three under ``gang``, under ``auto``, and under ``auto``
with ``slot="false"`` (the busy guests not hosted), the control that shows
the hazard this test looks for. From outside, cgroup freeze states show that
no busy guest runs while the barrier guest does, and that the two busy
guests run at the same time.
"""
from __future__ import annotations

import subprocess
import time

import pytest

from testbed import guests

from .conftest import PREFIX, DaemonProcess, sampling

BARRIER, BUSY, BUSY2 = PREFIX + "mixed-barrier", PREFIX + "mixed-busy", PREFIX + "mixed-busy2"
ALL = (BARRIER, BUSY, BUSY2)
MEASURE = 6.0


def set_policy(name: str, xml: str) -> None:
    subprocess.run(["virsh", "-c", guests.URI, "metadata", name, "--uri", guests.NAMESPACE, "--key", "cosched",
                    "--set", xml, "--live"], check=True, capture_output=True)


@pytest.fixture(scope="module")
def trio(libvirtd, guest_image):
    started = []
    for name, workload in ((BARRIER, "barrier"), (BUSY, "ep threads=1"), (BUSY2, "deadline threads=1")):
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


def thawed_together(seconds: float) -> tuple[int, int, int]:
    """(samples, samples in which a vCPU of the barrier guest and of a busy
    guest were thawed, twice in a row; samples in which a vCPU of each busy
    guest was), sampled under SCHED_FIFO (:func:`.conftest.sampling`)."""
    cgs = {n: sorted(guests.vcpu_cgroups(n)["v2"]) for n in ALL}
    assert all(cgs.values()), f"no vCPU cgroups found: {cgs}"
    samples = crossed = shared = 0
    prev = False
    with sampling():
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            barrier, busy, busy2 = [any(open(f"{cg}/cgroup.events").read().split()[-1] == "0" for cg in files)
                                    for files in cgs.values()]
            now = barrier and (busy or busy2)
            crossed += now and prev
            shared += busy and busy2
            prev = now
            samples += 1
            time.sleep(0.0005)
    return samples, crossed, shared


def test_busy_guests_left_to_the_host_no_longer_break_a_gang_and_share_their_turn(trio, tmp_path):
    daemon = DaemonProcess(tmp_path).start()
    try:
        for name in ALL:                                # the reference: all three take turns under gang
            set_policy(name, '<policy name="gang"/>')
        daemon.wait(lambda: any(sorted(c["members"]) == sorted(ALL) and c["mode"] == "freeze"
                                for c in daemon.status()["daemon"]["engine"]["cells"]), 10, "a gang of the three")
        time.sleep(1)
        ganged = hazard(daemon, BARRIER, MEASURE)

        for name in ALL:
            set_policy(name, '<policy name="auto"/>')

        def composed():
            b = daemon.domain(BARRIER) or {}
            return b.get("mode") == "gang" and all((daemon.domain(n) or {}).get("mode") == "none" and
                                                   (daemon.domain(n) or {}).get("hosted") for n in (BUSY, BUSY2))
        daemon.wait(composed, 30, "auto: the barrier guest in gang, the busy ones hosted")
        time.sleep(1)
        protected = hazard(daemon, BARRIER, MEASURE)
        samples, crossed, shared = thawed_together(3.0)
        explained = daemon.explain(BUSY)

        for name in (BUSY, BUSY2):
            set_policy(name, '<policy name="auto" slot="false"/>')
        daemon.wait(lambda: all((daemon.domain(n) or {}).get("hosted") is False for n in (BUSY, BUSY2)), 10,
                    "the busy guests free")
        time.sleep(1)
        free = hazard(daemon, BARRIER, MEASURE)
    finally:
        code = daemon.stop()
    print(f"\nbarrier guest hazard: all under gang {ganged:.3f}, auto {protected:.3f}, auto with the busy guests free "
          f"{free:.3f}; of {samples} samples, a busy guest thawed beside the barrier guest in {crossed}, "
          f"both busy guests thawed in {shared}")
    assert code == 0
    slots = {s["domain"]: s for c in explained["host"]["cells"] for s in c["slots"]}
    assert explained["hosted"] and list(slots) == [BARRIER, BUSY, BUSY2]
    assert slots[BUSY]["turn"] == slots[BUSY2]["turn"] != slots[BARRIER]["turn"]       # one shared turn
    assert crossed <= samples * 0.01, f"a busy guest ran in the gang's slot: {crossed} of {samples} samples"
    # their turn is 100 ms of a 150 ms cycle: both thawed in about two samples of three
    assert shared >= samples * 0.4, f"the busy guests did not run in one turn: both thawed in {shared} of {samples}"
    assert protected <= ganged + 0.05, f"hazard under auto {protected:.3f}, all under gang {ganged:.3f}"
    assert free >= protected + 0.05, f"control: free busy guests left the hazard at {free:.3f}"
