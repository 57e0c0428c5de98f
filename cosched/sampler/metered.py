"""The sampler's meter side: the in-kernel meter told which threads to follow, and exact windows from it.

Every guest whose vCPU threads changed is given to the meter with each
thread's state as ``/proc`` shows it (the meter's events correct it from the
next one on); a window's hazard and partial contention are the meter's
exact counts, and skew the difference of the vCPUs' exact lag (wait +
frozen) over the window.
"""
from __future__ import annotations

import os

from cosched.hostfs import HostFS
from cosched.kernel import on_cpu, parse_schedstat
from cosched.sampler.estimate import Window
from cosched.sampler.meter import DEAD, RUNNING, SLEEPING, UNKNOWN, WAITING, Meter, Reading
from cosched.sampler.proc import close_vcpu, read_state
from cosched.sampler.records import DomainStats, VcpuStats


class Metered:
    """The meter in use (``meter``), and which guests it counts."""

    def __init__(self, fs: HostFS, meter: Meter):
        self.fs, self.meter = fs, meter
        self._metered: dict[str, tuple[int, tuple[int, ...]]] = {}  # uuid -> (the meter's guest number, its tids)
        self._numbers = iter(range(1, 1 << 31))

    def read(self) -> Reading:
        return self.meter.read()

    def close(self) -> None:
        self.meter.close()
        self._metered.clear()

    def _state_now(self, pid: int | None, v: VcpuStats) -> int:
        """A thread's state as ``/proc`` shows it now, the meter's start (its
        events correct it from the next one on): a vCPU that runs without
        ever being switched out, alone on an isolated CPU, would otherwise
        count nothing. Running or queued: one switch-in more than out, or not."""
        if pid is None or v.fd is None or v.stat_fd is None:
            return UNKNOWN
        try:
            if not read_state(v.stat_fd)[0]:
                return SLEEPING
            running = on_cpu(parse_schedstat(os.pread(v.fd, 128, 0))[2],
                             self.fs.read_bytes(f"/proc/{pid}/task/{v.tid}/status"))
        except (OSError, ValueError):
            return UNKNOWN
        return RUNNING if running else WAITING

    def follow(self, domains: dict[str, DomainStats], pids: dict[str, int | None]) -> None:
        """Give the meter every domain whose vCPU threads changed (it counts
        them from now on), take away those gone. OSError: the meter failed."""
        for uuid in [u for u in self._metered if u not in domains]:
            self.meter.remove(self._metered.pop(uuid)[0])
        for uuid, stats in domains.items():
            tids = tuple(stats.vcpus[i].tid for i in sorted(stats.vcpus))
            known = self._metered.get(uuid)
            if known and known[1] == tids and all(v.base is not None for v in stats.vcpus.values()):
                continue
            number = known[0] if known else next(self._numbers)
            self.meter.add(number, {v.tid: self._state_now(pids.get(uuid), v) for v in stats.vcpus.values()})
            self._metered[uuid] = (number, tids)
            for v in stats.vcpus.values():
                v.base, v.lag = (v.run_ns, v.wait_ns), 0.0
            stats.metered = (0.0, 0.0)

    def window(self, uuid: str, stats: DomainStats, reading: Reading, dt: float) -> tuple[bool, Window | None]:
        """One domain's window from the meter: exact hazard and partial
        contention, and skew from each vCPU's exact lag (wait + frozen)."""
        known = self._metered.get(uuid)
        guest = reading.guests.get(known[0]) if known else None
        lags, gone = [], False
        for index in sorted(stats.vcpus):
            v = stats.vcpus[index]
            t = reading.threads.get(v.tid)
            if t is None or t.state == DEAD:
                close_vcpu(stats.vcpus.pop(index))
                gone = True
                continue
            v.run_ns, v.wait_ns = v.base[0] + int(t.run * 1e9), v.base[1] + int(t.wait * 1e9)
            lag = t.wait + t.frozen
            lags.append(lag - v.lag)
            v.lag = lag
        if guest is None or dt <= 0 or not lags:
            return gone, None
        hazard, partial = guest.hazard - stats.metered[0], guest.partial - stats.metered[1]
        stats.metered = (guest.hazard, guest.partial)
        return gone, Window(dt, hazard, partial, max(lags) - min(lags))
