"""What KVM counts for each guest: spinning and halting, where KVM runs it.

On a KVM host a vCPU that spins on a lock or a barrier with PAUSE in its
loop leaves the guest on a pause-loop exit, and KVM tries a directed yield
to a sibling (``directed_yield_attempted``); a vCPU with nothing to do halts
(``halt_exits``). These counters tell a guest that waits for its siblings
from one that computes, which the host scheduler's figures cannot: both
only want a CPU. ``auto`` reads them where they exist
(:mod:`cosched.policy.auto`).

Two sources, per guest, the first that answers:

* libvirt's vCPU domain statistics (``virConnectGetAllDomainStats`` with
  ``VIR_DOMAIN_STATS_VCPU``), which carry the hypervisor's own per-vCPU
  statistics as ``vcpu.<n>.<name>.sum`` (libvirt's name scheme, from QEMU's
  ``query-stats``); summed over the vCPUs;
* KVM's debugfs, per virtual machine: ``<debugfs>/kvm/<QEMU pid>-<fd>/<name>``,
  the sum over its vCPUs (any guest whose QEMU process is known, libvirt's
  or not; debugfs mounted, read as root).

Under TCG (no KVM) neither exists: a guest has no counters, and ``auto``
decides from the host scheduler's figures alone. Asking libvirt costs a
query to each QEMU: after :data:`QUIET_READS` reads in a row in which no
guest had counters, libvirt is asked once every :data:`QUIET_EVERY_S`.
"""
from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from cosched.hostfs import HostFS, mount_point

log = logging.getLogger("cosched.sampler")

SPINS = "directed_yield_attempted"
HALTS = "halt_exits"
QUIET_READS = 3
QUIET_EVERY_S = 60.0
_VCPU_KEY = re.compile(r"vcpu\.(\d+)\.([a-z_]+)(?:\.sum)?$")


@dataclass(frozen=True)
class KvmCounts:
    """One guest's cumulative counts, summed over its vCPUs."""

    spins: int          # pause-loop exits that tried a directed yield
    halts: int          # halt exits
    source: str         # "libvirt" or "debugfs"


def from_libvirt_stats(records: Mapping[str, object]) -> KvmCounts | None:
    """A guest's counts from one domain's libvirt statistics record (None:
    it reports neither counter)."""
    sums = {SPINS: 0, HALTS: 0}
    seen = False
    for key, value in records.items():
        m = _VCPU_KEY.match(key)
        if m and m.group(2) in sums and isinstance(value, int) and not isinstance(value, bool):
            sums[m.group(2)] += value
            seen = True
    return KvmCounts(sums[SPINS], sums[HALTS], "libvirt") if seen else None


class KvmStats:
    """Reads :class:`KvmCounts` per guest (by uuid) for a snapshot.

    ``libvirt_stats``: a callable giving libvirt's vCPU statistics records
    by domain uuid (None without a libvirt connection); debugfs is read
    through ``fs``. A source that fails is said once in the log and tried
    again on every read."""

    def __init__(self, fs: HostFS, libvirt_stats: Callable[[], Mapping[str, Mapping[str, object]]] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.fs = fs
        self.libvirt_stats = libvirt_stats
        self.clock = clock
        self._said: set[str] = set()
        self._quiet = 0                      # reads in a row in which libvirt gave no guest counters
        self._asked = float("-inf")

    def _say(self, what: str, error: Exception) -> None:
        if what not in self._said:
            self._said.add(what)
            log.warning("action=kvm-stats-unreadable source=%s error=%r", what, str(error))

    def _debugfs(self) -> dict[int, str]:
        """QEMU pid -> its KVM debugfs directory."""
        mount = mount_point(self.fs, "debugfs")
        if mount is None or not self.fs.exists(f"{mount}/kvm"):
            return {}
        out = {}
        for entry in self.fs.listdir(f"{mount}/kvm"):
            pid, dash, fd = entry.partition("-")
            if dash and pid.isdigit() and fd.isdigit():
                out[int(pid)] = f"{mount}/kvm/{entry}"
        return out

    def read(self, snap) -> dict[str, KvmCounts]:
        """Counts for every guest of ``snap`` that has them."""
        out: dict[str, KvmCounts] = {}
        now = self.clock()
        if self.libvirt_stats is not None and (self._quiet < QUIET_READS or now - self._asked >= QUIET_EVERY_S):
            self._asked = now
            try:
                records = self.libvirt_stats() or {}
            except Exception as e:          # a libvirt error or a lost connection: debugfs may still answer
                self._say("libvirt", e)
                records = {}
            for uuid, rec in records.items():
                got = from_libvirt_stats(rec)
                if got is not None:
                    out[uuid] = got
            self._quiet = 0 if out else self._quiet + 1
        dirs = None
        for d in snap.domains if snap else ():
            if d.uuid in out or d.pid is None:
                continue
            if dirs is None:
                try:
                    dirs = self._debugfs()
                except OSError as e:
                    self._say("debugfs", e)
                    dirs = {}
            where = dirs.get(d.pid)
            if where is None:
                continue
            try:
                out[d.uuid] = KvmCounts(int(self.fs.read(f"{where}/{SPINS}")), int(self.fs.read(f"{where}/{HALTS}")),
                                        "debugfs")
            except (OSError, ValueError) as e:
                self._say("debugfs", e)
        return out
