"""Live migration of a ``gang`` guest out of a rotation, and back in.

The second host is a second libvirtd: the one in the systemd container
(:mod:`testbed.container`), with a host UUID of its own (libvirt refuses to
migrate to a host with its own UUID), the guest image and console directory
at the same paths as here, and the same network (the migration stream goes
over 127.0.0.1). The subject is a transient guest annotated ``gang``,
rotating with two busy neighbours under the daemon of this host.

Migrated out (``VIR_MIGRATE_LIVE``), the guest runs on in the container's
QEMU: it progresses, its vCPU threads may run on every CPU, its live XML
there carries no pin (cosched pins by thread affinity, never through
libvirt) and still carries its cosched annotation. Here the daemon lists it
no more, the journal holds nothing of it, the neighbours rotate on, and the
container's QEMU, visible in this host's ``/proc``, is never taken for one
of this host's guests. Migrated back, it is a new QEMU here, managed under
``gang`` again from its annotation. A clean stop leaves the neighbours as
they were.
"""
from __future__ import annotations

import time

import libvirt
import pytest

from testbed import container, guests
from testbed.daemon import free_port

from .conftest import PREFIX, DaemonProcess
from .test_enforce import host_state
from .test_lifecycle import journaled, rotating, stopped

NEIGHBOURS = [PREFIX + f"mig-{c}" for c in "ab"]
SUBJECT = PREFIX + "mig-subject"
OTHER_HOST_UUID = "5b0f3f6e-3c2a-4f53-9d55-c05c0d0e0001"


@pytest.fixture(scope="module")
def other_host(tmp_path_factory, guest_image, libvirtd):
    """The container's libvirtd, ready to receive a guest: a libvirt connection to it and the container."""
    tmp = tmp_path_factory.mktemp("migration")
    (tmp / "src").mkdir()
    guests.CONSOLE_DIR.mkdir(parents=True, exist_ok=True)
    box = container.Container(container.build_root(), tmp / "src", guest_image.kernel.parent,
                              container.wheelhouse(), tmp / "console.log",
                              binds=(str(guest_image.kernel.parent), str(guests.CONSOLE_DIR)))
    box.start()
    try:
        box.writable_controllers()
        box.exec("sh", "-c", f"echo 'host_uuid = \"{OTHER_HOST_UUID}\"' >> /etc/libvirt/libvirtd.conf "
                             "&& systemctl restart libvirtd", check=True)
        conn = libvirt.open(f"qemu+unix:///system?socket=/proc/{box.leader}/root/run/libvirt/libvirt-sock")
        assert conn.getCapabilities().count(OTHER_HOST_UUID) == 1
        yield conn, box
        conn.close()
    finally:
        box.stop()


@pytest.fixture(scope="module")
def rotation(libvirtd, guest_image):
    started = []
    try:
        for name in [*NEIGHBOURS, SUBJECT]:
            with guests.paused(started):
                started.append(guests.start(name, workload="barrier", image=guest_image,
                                            policy=guests.annotation("gang")))
                started[-1].wait_for("cosched-result")
        yield started
    finally:
        for g in started:
            g.destroy()


def results_after(g: guests.Guest, t_ms: int, timeout: float = 30) -> int:
    """Wait for a workload result on the guest's console newer than ``t_ms``
    (its own clock), from whichever QEMU runs it; return the newest's."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        newest = max((r["t_ms"] for r in g.results()), default=0)
        if newest > t_ms:
            return newest
        time.sleep(0.5)
    raise AssertionError(f"{g.name}: no result after t_ms={t_ms} within {timeout} s")


def test_a_gang_guest_migrates_out_of_the_rotation_and_back(other_host, rotation, tmp_path):
    there, box = other_host
    subject = rotation[-1]
    here = guests.connection()
    uuid = here.lookupByName(SUBJECT).UUIDString()
    before = host_state(NEIGHBOURS)
    daemon = DaemonProcess(tmp_path).start()
    try:
        rotating(daemon, SUBJECT)
        assert journaled(daemon, uuid)
        last = results_after(subject, 0)
        uri = f"tcp://127.0.0.1:{free_port()}"

        start = time.monotonic()
        here.lookupByName(SUBJECT).migrate(there, libvirt.VIR_MIGRATE_LIVE, None, uri, 0)
        out_s = time.monotonic() - start
        stopped(daemon, SUBJECT, uuid)
        remote = there.lookupByName(SUBJECT)
        assert remote.state()[0] == libvirt.VIR_DOMAIN_RUNNING
        last = results_after(subject, last)                     # it runs on over there
        ncpus = there.getInfo()[2]
        assert remote.vcpuPinInfo(libvirt.VIR_DOMAIN_AFFECT_LIVE) == [(True,) * ncpus] * 2
        xml = remote.XMLDesc(0)
        assert "<vcpupin" not in xml and "<emulatorpin" not in xml, xml
        assert remote.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, guests.NAMESPACE) == '<policy name="gang"/>'
        pid = box.exec("cat", f"/run/libvirt/qemu/{SUBJECT}.pid", check=True).stdout.strip()
        allowed = box.exec("sh", "-c", f"grep -h Cpus_allowed_list /proc/{pid}/task/*/status", check=True).stdout
        assert set(allowed.split()) == {"Cpus_allowed_list:", f"0-{ncpus - 1}"}, allowed
        for name in NEIGHBOURS:
            rotating(daemon, name)
        time.sleep(3)                                           # several discovery passes
        assert daemon.domain(SUBJECT) is None and not journaled(daemon, uuid), \
            "the other host's QEMU was taken for a guest of this host"

        start = time.monotonic()
        remote.migrate(here, libvirt.VIR_MIGRATE_LIVE, None, uri, 0)
        back_s = time.monotonic() - start
        rotating(daemon, SUBJECT)                               # a new QEMU here, managed from its annotation
        results_after(subject, last)
        print(f"\nmigration under gang: out {out_s:.1f} s, back {back_s:.1f} s")
        assert daemon.proc.poll() is None
    finally:
        assert daemon.stop() == 0
    assert host_state(NEIGHBOURS) == before
    assert here.lookupByName(SUBJECT).vcpuPinInfo(libvirt.VIR_DOMAIN_AFFECT_LIVE) == [(True, True), (True, True)]
