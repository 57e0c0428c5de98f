"""Per-vCPU cgroups for guests that have none (Proxmox VE), made and undone by cosched.

Freezing one vCPU needs the vCPU thread alone in a cgroup. libvirt makes
those (``.../vcpuN``); Proxmox VE keeps every thread of a guest in its
``qemu.slice/VMID.scope``. For such a guest cosched makes a threaded child
``vcpuN`` of the cgroup the thread is in and moves the thread there (cgroup
v2 ``cgroup.threads``), exactly the layout libvirt makes, so everything else
(discovery, the freezer) treats it as it treats libvirt's. The guest's other
threads stay where they were; the scope becomes the threaded domain of its
``vcpuN`` children, its resource limits unchanged.

The journal entry (kind ``place``) holds the thread (TID and start time), the
cgroup it came from and the directory made; restoring moves the thread back
and removes the directory. A guest that stopped meanwhile leaves an empty
directory behind, removed the same way (a scope systemd removes takes its
children with it).
"""
from __future__ import annotations

import errno
from typing import Mapping

from cosched.actuators.journal import Gone, Target, thread_entry, thread_key
from cosched.actuators.sched import thread_start
from cosched.hostfs import HostFS

KIND = "place"


def vcpu_dir(cgroup: str, index: int) -> str:
    """The directory a vCPU thread now in ``cgroup`` is moved to."""
    return f"{cgroup.rstrip('/')}/vcpu{index}"


class PlacementKnob:
    """Record, apply, restore and verify one vCPU thread's own cgroup (v2 paths under ``mount``)."""

    kind = KIND

    def __init__(self, fs: HostFS):
        self.fs = fs

    @staticmethod
    def key(tid: int, start_time: int) -> str:
        return thread_key(KIND, tid, start_time)

    def record(self, target: Target, known: Mapping[str, dict]) -> dict[str, dict]:
        """Moving the thread from the v2 cgroup it is in now into a ``vcpuN``
        child of it, unless already known (nothing: no v2 tree, the thread
        is gone, or in a ``vcpuN`` already)."""
        mount = target.cgroup2_mount
        if not mount or self.key(target.tid, target.start_time) in known:
            return {}
        text = self.fs.read_or(f"/proc/{target.tid}/cgroup") or ""
        cgroup = next((line[3:] for line in text.splitlines() if line.startswith("0::")), None)
        if cgroup is None or cgroup.rstrip("/").rsplit("/", 1)[-1].startswith("vcpu"):
            return {}
        where = vcpu_dir(cgroup, target.vcpu)
        return thread_entry(KIND, target, **{"from": f"{mount}{cgroup.rstrip('/')}", "dir": f"{mount}{where}",
                                             "made": not self.fs.exists(f"{mount}{where}")})

    def apply(self, entry: dict) -> None:
        """Make the threaded ``vcpuN`` directory and move the thread in."""
        d = entry["dir"]
        if not self.fs.exists(d):
            self.fs.mkdir(d)
        if (self.fs.read_or(f"{d}/cgroup.type") or "").strip() != "threaded":
            self.fs.write(f"{d}/cgroup.type", "threaded")
        self.fs.write(f"{d}/cgroup.threads", str(entry["tid"]))

    def restore(self, entry: dict) -> None:
        gone = thread_start(self.fs, entry["tid"]) != entry["start_time"]
        if not gone:
            try:
                self.fs.write(f"{entry['from']}/cgroup.threads", str(entry["tid"]))
            except OSError as e:
                if e.errno not in (errno.ESRCH, errno.ENOENT):
                    raise
                gone = True
        if entry.get("made"):
            try:
                self.fs.rmdir(entry["dir"])
            except FileNotFoundError:
                pass
        if gone:
            raise Gone(f"thread {entry['tid']} has exited")

    def verify(self, entry: dict) -> bool:
        """The directory is gone (if cosched made it) and the thread back where it was, or gone."""
        if entry.get("made") and self.fs.exists(entry["dir"]):
            return False
        return thread_start(self.fs, entry["tid"]) != entry["start_time"] or not self._in(entry, entry["dir"])

    def _in(self, entry: dict, directory: str) -> bool:
        """Whether the thread's v2 cgroup is ``directory`` (a host path under the mount)."""
        text = self.fs.read_or(f"/proc/{entry['tid']}/cgroup") or ""
        path = next((line[3:] for line in text.splitlines() if line.startswith("0::")), None)
        return path is not None and directory.endswith(path) and path != "/"

    def exists(self, entry: dict) -> bool:
        return thread_start(self.fs, entry["tid"]) == entry["start_time"] or (
            bool(entry.get("made")) and self.fs.exists(entry["dir"]))
