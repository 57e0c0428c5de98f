"""The sampler's ``/proc`` side: one set of descriptors per vCPU thread, and a window estimated from them.

Each vCPU thread keeps its ``schedstat`` and ``stat`` open (a ``pread`` costs
about 1 µs, an ``open`` about 10 µs), and its cgroup's ``cgroup.stat.local``
where the kernel counts frozen time (``frozen_usec``, Linux 6.17 on). Without
the meter, a window's hazard, partial contention and skew are estimated from
them (:mod:`cosched.sampler.estimate`, which says how and with what error).
"""
from __future__ import annotations

import logging
import os

from cosched.hostfs import OUT_OF_FILES, HostFS
from cosched.kernel import frozen_usec, parse_schedstat, stat_runnable_cpu
from cosched.model import Host, Vcpu
from cosched.sampler.estimate import Window, estimate, place
from cosched.sampler.records import DomainStats, VcpuStats

log = logging.getLogger("cosched.sampler")


def read_schedstat(fd: int) -> tuple[int, int]:
    """(run ns, wait ns) from an open ``schedstat`` descriptor."""
    return parse_schedstat(os.pread(fd, 128, 0))[:2]


def read_frozen(fd: int) -> float:
    """Seconds the cgroup has been frozen, from an open ``cgroup.stat.local``."""
    return frozen_usec(os.pread(fd, 256, 0)) / 1e6


def read_state(fd: int | None) -> tuple[bool, int | None]:
    """Whether the thread is running or runnable (state ``R``), and the host
    CPU it is on, from an open ``stat`` descriptor."""
    if fd is None:
        return False, None
    try:
        return stat_runnable_cpu(os.pread(fd, 1024, 0))
    except OSError:
        return False, None


def close_fd(v: VcpuStats, name: str) -> None:
    fd = getattr(v, name)
    if fd is not None:
        os.close(fd)
        setattr(v, name, None)


def close_vcpu(v: VcpuStats) -> None:
    for name in ("fd", "stat_fd", "frozen_fd"):
        close_fd(v, name)


class Proc:
    """Opens each vCPU thread's descriptors and estimates windows from them.
    ``opened`` counts the threads opened; ``out_of_files``: the last open
    failed for want of descriptors (logged once until one succeeds)."""

    def __init__(self, fs: HostFS):
        self.fs = fs
        self.opened = 0
        self.out_of_files = False

    def open(self, pid: int, vcpu: Vcpu, host: Host) -> VcpuStats | None:
        tid = vcpu.tid
        try:
            fd = self.fs.open_fd(f"/proc/{pid}/task/{tid}/schedstat")
        except OSError as e:                   # gone, mostly
            if e.errno in OUT_OF_FILES and not self.out_of_files:
                log.error("action=vcpu-unsampled tid=%d error=%r: vCPUs past the open files limit go unsampled",
                          tid, str(e))
            self.out_of_files = e.errno in OUT_OF_FILES
            return None
        self.out_of_files = False
        try:
            run, wait = read_schedstat(fd)
        except (OSError, ValueError):          # exited since
            os.close(fd)
            return None
        self.opened += 1
        try:
            stat_fd = self.fs.open_fd(f"/proc/{pid}/task/{tid}/stat")
        except OSError:
            stat_fd = None
        runnable, cpu = read_state(stat_fd)
        v = VcpuStats(tid, fd, run, wait, stat_fd=stat_fd, runnable=runnable, cpu=cpu)
        path = host.frozen_time_file(vcpu)
        if path is not None:
            try:
                v.frozen_fd = self.fs.open_fd(path)
                v.costop = read_frozen(v.frozen_fd)
            except (OSError, ValueError):      # before Linux 6.17: the engine's count
                close_fd(v, "frozen_fd")
        return v

    def costop(self, v: VcpuStats, engine: float | None) -> float:
        """Seconds the vCPU was co-stopped since the last sample: its
        cgroup's own frozen time where the kernel counts it, exact to the
        window; else the engine's count, which the switcher reports ten
        times a second, so a window gets a tenth of a second's co-stops at
        once and the ones around it none."""
        if v.frozen_fd is not None:
            try:
                frozen = read_frozen(v.frozen_fd)
            except (OSError, ValueError):      # its cgroup went: the engine's count from now on
                close_fd(v, "frozen_fd")
                v.costop = engine if engine is not None else v.costop
                return 0.0
        else:
            frozen = engine if engine is not None else v.costop
        d, v.costop = max(frozen - v.costop, 0.0), frozen
        return d

    def window(self, uuid: str, stats: DomainStats, costop: dict[tuple[str, int], float],
               dt: float) -> tuple[bool, Window | None]:
        """One domain's window from its vCPUs' schedstat and stat (whether a
        thread gone, the window or None)."""
        placed, stopped, cpus = [], [], []
        gone = False
        for index in sorted(stats.vcpus):
            v = stats.vcpus[index]
            try:
                run, wait = read_schedstat(v.fd)
            except (OSError, ValueError, IndexError):
                close_vcpu(stats.vcpus.pop(index))
                gone = True
                continue
            runnable, cpu = read_state(v.stat_fd)
            waiting, v.runnable = v.runnable and runnable, runnable
            stayed, v.cpu = (cpu if cpu == v.cpu else None), cpu
            d_run, d_wait = (run - v.run_ns) / 1e9, (wait - v.wait_ns) / 1e9
            v.run_ns, v.wait_ns = run, wait
            d_costop = self.costop(v, costop.get((uuid, index)))
            if dt > 0:
                placed.append(place(v.carry, d_run, d_wait, dt, waiting))
                stopped.append(min(d_costop, dt))
                cpus.append(stayed)
        if dt <= 0 or not placed:
            return gone, None
        # a guest whose vCPUs all slept through the window (most of them, on a big host):
        # nothing to estimate, the window is one of no hazard, contention or skew
        if not any(r or w for r, w in placed) and not any(stopped):
            return gone, Window(dt, 0.0, 0.0, 0.0)
        return gone, estimate(dt, placed, stopped, cpus)
