"""vCPU pinning of guests no host libvirtd runs: the thread's CPU affinity.

libvirt's guests are pinned through libvirt (:mod:`~cosched.actuators.pinning`),
which owns their cpusets. A QEMU process started without the host's libvirtd
(Proxmox VE, a KubeVirt pod, a hand-started guest) has no such owner: its
vCPU threads are pinned with ``sched_setaffinity(2)``, within the CPUs its
cgroup's cpuset allows.

The journal entry (kind ``affinity``) names the thread by TID and start
time, like the ``sched`` knob's, and holds its affinity before cosched's
first pin; restoring sets it back.
"""
from __future__ import annotations

import os
from typing import Mapping

from cosched.actuators.journal import Gone, Target, thread_entry, thread_key
from cosched.actuators.sched import thread_start
from cosched.hostfs import HostFS

KIND = "affinity"


class AffinityKnob:
    """Apply, record, restore and verify a thread's CPU affinity.

    ``get`` and ``set`` default to the real system calls; tests pass fakes.
    """

    kind = KIND

    def __init__(self, fs: HostFS, get=None, set=None):
        self.fs = fs
        self.get = get or (lambda tid: tuple(sorted(os.sched_getaffinity(tid))))
        self.set = set or (lambda tid, cpus: os.sched_setaffinity(tid, cpus))

    @staticmethod
    def key(tid: int, start_time: int) -> str:
        return thread_key(KIND, tid, start_time)

    def record(self, target: Target, known: Mapping[str, dict]) -> dict[str, dict]:
        """The thread's affinity now, unless already known."""
        if self.key(target.tid, target.start_time) in known:
            return {}
        return thread_entry(KIND, target, cpus=list(self.get(target.tid)))

    def apply(self, tid: int, cpus) -> None:
        self.set(tid, tuple(cpus))

    def _same_thread(self, entry: dict) -> None:
        if thread_start(self.fs, entry["tid"]) != entry["start_time"]:
            raise Gone(f"thread {entry['tid']} has exited")

    def restore(self, entry: dict) -> None:
        self._same_thread(entry)
        self.set(entry["tid"], tuple(entry["cpus"]))

    def verify(self, entry: dict) -> bool:
        try:
            self._same_thread(entry)
            return list(self.get(entry["tid"])) == list(entry["cpus"])
        except (Gone, ProcessLookupError):
            return True

    def exists(self, entry: dict) -> bool:
        return thread_start(self.fs, entry["tid"]) == entry["start_time"]
