"""A gang guest's lifecycle: nothing stays frozen, pinned or journaled for a guest that no longer runs.

Two busy 2-vCPU guests take turns under ``gang`` with a third, the subject:
a persistent guest (defined, then started) whose annotation asks for
``gang``. While the rotation runs, the subject is suspended and resumed,
saved and restored (``virsh save``/``restore``), saved by libvirt and
started again (``managedsave``), reset (``virsh reset``), and destroyed in
its slot and out of it. Two more guests reboot and power themselves off
from inside under ``gang`` (the test guest's init does so when told:
``reboot_ms``, ``poweroff_ms``), as a guest's own shutdown or reboot does.

Whenever a guest has stopped, the journal holds nothing of it and the
daemon no longer lists it; whenever it runs again it is managed under
``gang`` again (never taken for a guest the platform pinned: a saved
guest's live XML carries the pins cosched had set) and its workload
progresses. Its persistent definition never gains a pin, and a clean stop
leaves the two neighbours as they were.
"""
from __future__ import annotations

import os
import time

import libvirt
import pytest

from cosched.actuators.journal import Journal
from testbed import guests

from .conftest import PREFIX, DaemonProcess
from .test_enforce import host_state

NEIGHBOURS = [PREFIX + f"life-{c}" for c in "ab"]
SUBJECT = PREFIX + "life-subject"
SAVED = f"/var/tmp/{SUBJECT}.save"


@pytest.fixture(scope="module")
def hosts(libvirtd, guest_image):
    started = []
    conn = guests.connection()
    try:
        for name in NEIGHBOURS:
            with guests.paused(started):
                started.append(guests.start(name, workload="barrier", image=guest_image,
                                            policy=guests.annotation("gang")))
                started[-1].wait_for("cosched-result")
        xml = guests.domain_xml(SUBJECT, workload="barrier", image=guest_image, policy=guests.annotation("gang"),
                                console_log=guests.CONSOLE_DIR / f"{SUBJECT}.log")
        conn.defineXML(xml.replace("<on_reboot>destroy</on_reboot>", "<on_reboot>restart</on_reboot>"))
        with guests.paused(started):
            conn.lookupByName(SUBJECT).create()
            subject = guests.Guest(SUBJECT, guests.CONSOLE_DIR / f"{SUBJECT}.log")
            subject.wait_for("cosched-result")
        yield started, subject
    finally:
        for g in started:
            g.destroy()
        try:
            dom = conn.lookupByName(SUBJECT)
            if dom.isActive():
                dom.destroy()
            if dom.hasManagedSaveImage():
                dom.managedSaveRemove()
            dom.undefine()
        except libvirt.libvirtError:
            pass
        if os.path.exists(SAVED):
            os.unlink(SAVED)


def journaled(daemon: DaemonProcess, uuid: str) -> list[dict]:
    return [e for e in Journal(f"{daemon.state_dir}/journal.json").entries.values() if uuid in str(e)]


def rotating(daemon: DaemonProcess, name: str, timeout: float = 30) -> None:
    """``name`` managed under gang with fresh threads, and the gang cell changing slots."""
    daemon.wait(lambda: (d := daemon.domain(name)) and d["managed"] and d["mode"] == "gang" and len(d["vcpus"]) == 2,
                timeout, f"{name} managed under gang")
    s = daemon.status()["daemon"]["engine"]["switches"].get("gang", 0)
    daemon.wait(lambda: daemon.status()["daemon"]["engine"]["switches"].get("gang", 0) > s + 3, 10, "rotating")


def progressing(g: guests.Guest, after: str, seconds: float = 20) -> None:
    """The guest's own counter moves (read from its memory, whichever QEMU runs it now)."""
    g._live = None
    end = time.monotonic() + seconds
    first, why = None, None
    while time.monotonic() < end:
        try:
            now = g.counters()
        except (RuntimeError, OSError, libvirt.libvirtError) as e:
            g._live, now, why = None, None, e
        if now is not None:
            if first is None:
                first = now["iters"]
            elif now["iters"] > first:
                return
        time.sleep(0.2)
    raise AssertionError(f"{g.name} made no progress in {seconds} s after {after} (first {first}, {why!r})")


def stopped(daemon: DaemonProcess, name: str, uuid: str) -> None:
    """The guest has stopped: the daemon lists it no more and the journal holds nothing of it."""
    daemon.wait(lambda: daemon.domain(name) is None, 15, f"{name} gone from the daemon")
    daemon.wait(lambda: not journaled(daemon, uuid), 10, f"{name} gone from the journal")


def in_slot(daemon: DaemonProcess, name: str, thawed: bool, timeout: float = 10) -> None:
    """Wait until every vCPU of ``name`` is thawed (its slot) or frozen (another's)."""
    cgs = guests.vcpu_cgroups(name)["v2"]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if all(open(f"{cg}/cgroup.events").read().split()[-1] == ("0" if thawed else "1") for cg in cgs):
            return
        time.sleep(0.001)
    raise AssertionError(f"{name}: never {'in' if thawed else 'out of'} its slot")


def test_a_gang_guest_through_its_lifecycle_leaves_nothing_behind(hosts, tmp_path):
    _, subject = hosts
    conn = guests.connection()
    dom = conn.lookupByName(SUBJECT)
    uuid = dom.UUIDString()
    before = host_state(NEIGHBOURS)
    daemon = DaemonProcess(tmp_path).start()
    try:
        rotating(daemon, SUBJECT)
        assert journaled(daemon, uuid)                       # something to leave behind

        dom.suspend()                                        # suspend and resume
        time.sleep(1.0)
        dom.resume()
        rotating(daemon, SUBJECT)
        progressing(subject, "resume")

        dom.save(SAVED)                                      # virsh save, restore
        stopped(daemon, SUBJECT, uuid)
        conn.restore(SAVED)
        os.unlink(SAVED)
        rotating(daemon, SUBJECT)
        progressing(subject, "restore")

        dom = conn.lookupByName(SUBJECT)                     # managedsave, start
        dom.managedSave()
        stopped(daemon, SUBJECT, uuid)
        dom.create()
        rotating(daemon, SUBJECT)
        progressing(subject, "managedsave and start")

        pid = guests.qemu_pid(SUBJECT)
        dom.reset()                                          # virsh reset: the same QEMU
        time.sleep(1.0)
        assert dom.isActive() and guests.qemu_pid(SUBJECT) == pid
        rotating(daemon, SUBJECT)

        for thawed in (True, False):                         # destroyed in its slot, and out of it
            in_slot(daemon, SUBJECT, thawed)
            dom.destroy()
            stopped(daemon, SUBJECT, uuid)
            dom.create()
            rotating(daemon, SUBJECT)
        assert dom.vcpuPinInfo(libvirt.VIR_DOMAIN_AFFECT_CONFIG) == [(True, True), (True, True)]
        assert daemon.proc.poll() is None
    finally:
        assert daemon.stop() == 0
    assert host_state(NEIGHBOURS) == before
    assert dom.vcpuPinInfo(libvirt.VIR_DOMAIN_AFFECT_LIVE) == [(True, True), (True, True)]


@pytest.mark.parametrize("how", ["reboot", "poweroff"])
def test_a_gang_guest_that_reboots_or_powers_off_from_inside(hosts, guest_image, tmp_path, how):
    name = PREFIX + f"life-{how}"
    daemon = DaemonProcess(tmp_path).start()
    started, _ = hosts
    try:
        with guests.paused(started):
            xml = guests.domain_xml(name, workload=f"barrier {how}_ms=8000", image=guest_image,
                                    policy=guests.annotation("gang"), console_log=guests.CONSOLE_DIR / f"{name}.log")
            if how == "reboot":
                xml = xml.replace("<on_reboot>destroy</on_reboot>", "<on_reboot>restart</on_reboot>")
            (guests.CONSOLE_DIR / f"{name}.log").unlink(missing_ok=True)
            conn = guests.connection()
            uuid = conn.createXML(xml, 0).UUIDString()
            g = guests.Guest(name, guests.CONSOLE_DIR / f"{name}.log")
            g.wait_for("cosched-result")
        rotating(daemon, name)
        g.wait_for(f"cosched-{how}", timeout=60)
        if how == "poweroff":
            stopped(daemon, name, uuid)
        else:
            daemon.wait(lambda: g.console().count("cosched-ready") >= 2, 180, "booted again")
            rotating(daemon, name)
            progressing(g, "reboot")
        assert daemon.proc.poll() is None
    finally:
        assert daemon.stop() == 0
        try:
            guests.connection().lookupByName(name).destroy()
        except libvirt.libvirtError:
            pass
