"""A guest started as Proxmox VE starts one, managed with the same guarantees as a libvirt guest.

No libvirt: QEMU is started directly with the command line Proxmox's ``qm``
builds (``-name NAME,debug-threads=on``, a QMP server socket
``.../qemu-server/VMID.qmp``, ``-pidfile .../qemu-server/VMID.pid``,
``-daemonize``, ``-smbios type=1,uuid=``; Debian's QEMU lacks the ``-id``
option Proxmox's own build adds, so the VM id comes from those paths and
the scope, as it would there too), its process moved
into a ``qemu.slice/VMID.scope`` cgroup made by the test (as systemd makes it
for ``qm``), and its policy is a tag in a Proxmox-format ``VMID.conf``.
cosched (``sources = ["processes"]``) finds both guests, learns their vCPU
threads from QEMU over QMP, gives each vCPU thread its own cgroup under the
scope, runs them as a gang, follows a tag change, and leaves the cgroup tree
as it found it, on SIGTERM and through ``cosched reset`` after a SIGKILL.

What such a platform decided about a guest's CPUs stands, as for libvirt's
guests: a guest whose vCPU thread runs under SCHED_FIFO (a hook script's
doing) and a guest whose threads Proxmox's ``affinity: 1`` confined to CPU
1, both tagged for ``gang``, are never placed, frozen or re-pinned.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid as uuidlib
from pathlib import Path

import pytest

from testbed import guests

from .conftest import DaemonProcess, sampling

NAMES = ("cosched-it-pve-a", "cosched-it-pve-b")
VMIDS = (8101, 8102)


class PveGuest:
    def __init__(self, name: str, vmid: int, tmp: Path, image, workload: str = "barrier interval_ms=100"):
        self.name, self.vmid = name, vmid
        self.uuid = str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, name))
        run = tmp / "qemu-server"
        run.mkdir(exist_ok=True)
        self.qmp, self.pidfile, self.console = run / f"{vmid}.qmp", run / f"{vmid}.pid", tmp / f"{vmid}.console"
        argv = ["qemu-system-x86_64", "-name", f"{name},debug-threads=on", "-no-shutdown",
                "-chardev", f"socket,id=qmp,path={self.qmp},server=on,wait=off", "-mon", "chardev=qmp,mode=control",
                "-pidfile", str(self.pidfile), "-daemonize", "-smbios", f"type=1,uuid={self.uuid}",
                "-smp", "2,sockets=1,cores=2,maxcpus=2", "-nodefaults", "-display", "none", "-cpu", "qemu64",
                "-m", "96", "-accel", "tcg", "-kernel", str(image.kernel), "-initrd", str(image.initrd),
                "-append", f"console=ttyS0 quiet panic=-1 -- {workload}",
                "-serial", f"file:{self.console}"]
        subprocess.run(argv, check=True, capture_output=True)
        self.pid = int(self.pidfile.read_text())
        v2 = guests.cgroup_mounts()[0]
        self.scope = f"{v2}/qemu.slice/{vmid}.scope"
        os.makedirs(self.scope, exist_ok=True)
        Path(self.scope, "cgroup.procs").write_text(str(self.pid))

    def tree(self) -> dict:
        """The scope's cgroup tree: its directories, and which vCPU threads sit where
        (QEMU's other threads may come and go on their own)."""
        vcpus = {t for t in os.listdir(f"/proc/{self.pid}/task")
                 if open(f"/proc/{self.pid}/task/{t}/comm").read().startswith("CPU ")}
        tree = {}
        for d, _, _ in os.walk(self.scope):
            try:
                tree[d] = sorted(set(open(f"{d}/cgroup.threads").read().split()) & vcpus)
            except FileNotFoundError:
                pass            # removed (by the daemon giving the threads back) since the walk listed it
        return tree

    def iterations(self) -> int:
        """The iterations on the last complete result line (one still being written may be cut short)."""
        done = self.console.read_text(errors="replace").rpartition("\n")[0]
        counts = re.findall(r"cosched-result.* iters=(\d+)", done)
        return int(counts[-1]) if counts else 0

    def destroy(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for _ in range(100):
            if not os.path.exists(f"/proc/{self.pid}"):
                break
            time.sleep(0.05)
        for d, _, _ in sorted(os.walk(self.scope), reverse=True):
            os.rmdir(d)


@pytest.fixture(scope="module")
def pve(libvirtd, guest_image, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pve")
    conf = tmp / "pve-config"
    conf.mkdir()
    gs = []
    try:
        for name, vmid in zip(NAMES, VMIDS):
            gs.append(PveGuest(name, vmid, tmp, guest_image))
            tag(conf, len(gs) - 1, "cosched-gang-q30;web")
        deadline = time.monotonic() + 60
        while not all(g.iterations() for g in gs):
            assert time.monotonic() < deadline, "the guests did not boot"
            time.sleep(0.2)
        yield gs, conf
    finally:
        for g in gs:
            g.destroy()
        try:
            os.rmdir(os.path.dirname(gs[0].scope))
        except (OSError, IndexError):
            pass


def tag(conf: Path, i: int, tags: str) -> None:
    """Give guest ``i`` these tags in its Proxmox-format config."""
    (conf / f"{VMIDS[i]}.conf").write_text(f"cores: 2\nname: {NAMES[i]}\ntags: {tags}\n")


def frozen(g: PveGuest, index: int) -> str:
    return open(f"{g.scope}/vcpu{index}/cgroup.events").read().split()[-1]


def test_a_proxmox_style_guest_is_found_placed_ganged_and_given_back(pve, tmp_path):
    gs, conf = pve
    before = [g.tree() for g in gs]
    assert all(list(t) == [g.scope] for g, t in zip(gs, before))        # every thread in the scope, no children
    daemon = DaemonProcess(tmp_path, extra_config=f'sources = ["processes"]\npve_config_dir = "{conf}"\n').start()
    try:
        daemon.wait(lambda: daemon.status()["daemon"]["engine"]["switches"].get("gang", 0) > 20, 20, "a gang of two")
        for g in gs:
            d = daemon.domain(g.name)
            assert (d["uuid"], d["pid"], d["source"], d["policy"], d["params"]["quantum-ms"]) == (
                g.uuid, g.pid, "qemu", "gang", 30)
            threads = {int(t) for t in os.listdir(f"/proc/{g.pid}/task")
                       if open(f"/proc/{g.pid}/task/{t}/comm").read().startswith("CPU ")}
            assert {v["tid"] for v in d["vcpus"]} == threads
            for v in d["vcpus"]:                                            # each in its own threaded cgroup
                assert open(f"{g.scope}/vcpu{v['index']}/cgroup.threads").read().split() == [str(v["tid"])]
                assert open(f"{g.scope}/vcpu{v['index']}/cgroup.type").read().strip() == "threaded"
        assert "vcpus_from_qmp=2" in daemon.log.read_text()               # QEMU's own word on its vCPU threads
        seen, overlaps, prev = set(), 0, False
        samples = 300
        with sampling():
            for _ in range(samples):
                now = tuple(frozen(g, 0) + frozen(g, 1) for g in gs)
                seen.add(now)
                # one pass reads the files one after another: a switch landing between two reads of a
                # pass is no overlap, two passes in a row that both see them running together are
                both = all("0" in s for s in now)
                overlaps += both and prev
                prev = both
                time.sleep(0.002)
        # each guest ran alone in its slots, and every switch waited for the outgoing guest to be
        # frozen before thawing the next (the switcher says when one does not). Under the host
        # scheduler a pass was held off the CPU for up to 63-220 ms, longer than a 30 ms slot, and
        # read the guests' files on either side of slot changes: 0-3 such pairs of passes in 300.
        # Under SCHED_FIFO there were none in 3,600 passes (raw runs in the tree of commit b2dbbaf);
        # one pair is allowed, since a pass still took up to 35 ms there
        assert ("00", "11") in seen and ("11", "00") in seen and overlaps <= 1, (seen, overlaps)
        assert not [e for e in daemon.status()["daemon"]["engine"]["errors"] if "not frozen" in e]
        progress = [g.iterations() for g in gs]
        time.sleep(1.5)
        assert all(g.iterations() > p for g, p in zip(gs, progress)), "a guest made no progress"
        # the tag changes: the guest leaves the gang and gets its threads back in its scope
        tag(conf, 1, "web")
        daemon.wait(lambda: (d := daemon.domain(NAMES[1])) and d["policy"] == "none"
                    and gs[1].tree() == before[1], 8, "tag change followed")
    finally:
        assert daemon.stop() == 0
    assert [g.tree() for g in gs] == before


def test_sigkill_then_reset_leaves_the_cgroup_tree_as_found(pve, tmp_path):
    gs, conf = pve
    for i in range(len(gs)):
        tag(conf, i, "cosched-gang-q30")
    before = [g.tree() for g in gs]
    daemon = DaemonProcess(tmp_path, extra_config=f'sources = ["processes"]\npve_config_dir = "{conf}"\n').start()
    try:
        daemon.wait(lambda: daemon.status()["daemon"]["engine"]["switches"].get("gang", 0) > 10, 20, "a gang")
        assert [g.tree() for g in gs] != before
    finally:
        os.killpg(os.getpgid(daemon.proc.pid), signal.SIGKILL)
        daemon.proc.wait()
    reset = subprocess.run([sys.executable, "-m", "cosched", "reset", "--config", str(daemon.config)],
                           capture_output=True, text=True)
    assert reset.returncode == 0, reset.stderr
    assert [g.tree() for g in gs] == before
    assert all(frozen == "0" for g in gs for frozen in [open(f"{g.scope}/cgroup.events").read().split()[-1]])


def vcpu_threads(g: PveGuest) -> dict[int, tuple]:
    """Each vCPU thread's scheduling policy and affinity, read from outside."""
    return {int(t): (os.sched_getscheduler(int(t)), tuple(sorted(os.sched_getaffinity(int(t)))))
            for t in os.listdir(f"/proc/{g.pid}/task") if open(f"/proc/{g.pid}/task/{t}/comm").read().startswith("CPU ")}


def test_a_realtime_or_confined_guest_is_left_as_the_platform_set_it(pve, guest_image, tmp_path):
    gs, conf = pve
    for i in range(len(gs)):
        tag(conf, i, "cosched-gang-q30")
    rt = PveGuest("cosched-it-pve-rt", 8103, tmp_path, guest_image, workload="idle")
    narrow = PveGuest("cosched-it-pve-narrow", 8104, tmp_path, guest_image, workload="idle")
    try:
        for g in (rt, narrow):
            (conf / f"{g.vmid}.conf").write_text(f"cores: 2\nname: {g.name}\ntags: cosched-gang-q30\n")
        vcpu0 = min(vcpu_threads(rt))
        os.sched_setscheduler(vcpu0, os.SCHED_FIFO, os.sched_param(1))         # the test guest's own thread
        subprocess.run(["taskset", "--all-tasks", "--cpu-list", "-p", "1", str(narrow.pid)], check=True,
                       capture_output=True)                                      # as qm does for affinity: 1
        before = {g.name: (g.tree(), vcpu_threads(g)) for g in (rt, narrow)}
        daemon = DaemonProcess(tmp_path, extra_config=f'sources = ["processes"]\npve_config_dir = "{conf}"\n').start()
        try:
            daemon.wait(lambda: daemon.status()["daemon"]["engine"]["switches"].get("gang", 0) > 10, 20, "a gang")
            daemon.wait(lambda: (daemon.domain(rt.name) or {}).get("left_alone")
                        and "confines it" in ((daemon.domain(narrow.name) or {}).get("error") or ""), 10,
                        "the realtime guest left alone, the confined one refused")
            seen = set()
            end = time.monotonic() + 2
            while time.monotonic() < end:
                seen.add(tuple((g.tree() == before[g.name][0], vcpu_threads(g) == before[g.name][1])
                               for g in (rt, narrow)))
                time.sleep(0.02)
            status = {d["name"]: d for d in daemon.status()["domains"]}
        finally:
            assert daemon.stop() == 0
        assert seen == {((True, True), (True, True))}, seen              # never placed, frozen or re-pinned
        assert status[rt.name]["left_alone"].startswith("realtime vCPUs: vCPU 0 under SCHED_FIFO"), status[rt.name]
        assert status[narrow.name]["confined"] == {"0": [1], "1": [1]} and not status[narrow.name]["managed"]
        assert all(status[g.name]["managed"] for g in gs)
        assert {g.name: (g.tree(), vcpu_threads(g)) for g in (rt, narrow)} == before
    finally:
        rt.destroy()
        narrow.destroy()
