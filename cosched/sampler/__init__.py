"""The sampler: reads every vCPU's schedstat at a fixed rate and accumulates
per-vCPU run/wait and per-domain hazard, partial contention and skew.

Its cost grows with the vCPUs it reads (two ``pread`` and some arithmetic
each, about 15 µs per vCPU and pass on the idle development host, 80-100
µs with four busy 2-vCPU guests on its two CPUs, where the period then
stretched to 45-84 ms: ``docs/decisions/0015-in-kernel-meter-against-the-trace.md``), so the daemon
keeps its observation within a CPU budget (``sample_budget_pct`` of one
CPU): the rest of the daemon (resyncs, the main loop, ``/metrics`` scrapes;
not the switcher process) is measured and comes off the budget first, down
to half of it, and when a pass costs more than what is left allows at
``sample_interval_ms``, the period stretches to ``pass cost / what is left``
(averages over recent passes and the last ten seconds), and every window
with it. Totals stay exact; windows, and so skew and hazard's resolution,
get coarser. The period in force is :attr:`Sampler.period`.

It follows the current :class:`~cosched.model.Snapshot` (a callable returns
it), keeps one open descriptor per vCPU thread (a ``pread`` costs about 1 µs,
an ``open`` about 10 µs), and samples on an absolute-time schedule so a late
wake-up shortens the next sleep instead of drifting. How each figure is
estimated, and its error bound, is in :mod:`cosched.sampler.estimate`.
A thread that vanished (ESRCH/ENOENT) is dropped and ``on_vanished`` asks
discovery for a resync.

A vCPU's lag counts the time cosched held it co-stopped. Where the kernel
counts a cgroup's frozen time (``frozen_usec`` in ``cgroup.stat.local``,
Linux 6.17 on) the sampler reads it from each vCPU's own cgroup with the
rest, so each window gets exactly the co-stops in it; before, it takes the
engine's count, which comes ten times a second (a window then gets a tenth
of a second's co-stops at once: ``relaxed``'s skew, one vCPU co-stopped
at a time, read 2.6-4.4x the kernel trace's that way; docs/reference/metrics.md).

Where the in-kernel meter runs (:mod:`cosched.sampler.meter`; config key
``meter``), a pass reads it instead of ``/proc``: every thread's run, wait
and frozen time and every guest's hazard and partial contention, counted
by the kernel's scheduler events, in two map reads. Hazard and partial
contention are then exact, not estimated, and skew is the exact lag
(wait + frozen) difference over the window. ``schedstat`` is read once per
thread, when it is first seen, so that run and wait keep counting from the
kernel's totals. Should the meter fail, the sampler reads ``/proc`` again
and says so (``action=meter-off``). :attr:`Sampler.source` says which is
in use.
"""
from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from cosched.hostfs import OUT_OF_FILES, HostFS
from cosched.kernel import frozen_usec, on_cpu, parse_schedstat, stat_runnable_cpu
from cosched.model import Host, Snapshot, Vcpu
from cosched.histogram import Histogram
from cosched.sampler.estimate import VcpuCarry, Window, estimate, place
from cosched.sampler.meter import DEAD, RUNNING, SLEEPING, UNKNOWN, WAITING, Meter, Reading

log = logging.getLogger("cosched.sampler")

SKEW_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
REST_AVERAGE_S = 10.0     # the rest of the daemon is bursty (a resync every 5 s): averaged over this long


@dataclass
class VcpuStats:
    tid: int
    fd: int | None
    run_ns: int = 0             # last cumulative schedstat values
    wait_ns: int = 0
    costop: float = 0.0         # last cumulative costop seconds (its cgroup's frozen time, or the engine's)
    frozen_fd: int | None = None  # its v2 cgroup.stat.local (frozen_usec), where the kernel has it
    carry: VcpuCarry = field(default_factory=VcpuCarry)
    stat_fd: int | None = None  # /proc/.../stat, for the thread's state
    runnable: bool = False      # state R at the last sample
    cpu: int | None = None      # host CPU at the last sample
    base: tuple[int, int] | None = None  # metered: run and wait ns when the meter's count began
    lag: float = 0.0            # metered: last wait + frozen seconds


@dataclass
class DomainStats:
    name: str
    vcpus: dict[int, VcpuStats] = field(default_factory=dict)
    hazard: float = 0.0
    partial: float = 0.0
    observed: float = 0.0       # seconds of windows measured
    skew: Histogram = field(default_factory=lambda: Histogram(SKEW_BUCKETS))
    last_skew: float = 0.0
    metered: tuple[float, float] = (0.0, 0.0)   # metered: last hazard and partial seconds


@dataclass(frozen=True)
class VcpuView:
    """One vCPU's cumulative seconds, as the kernel credits them (``run``,
    ``wait``), and ``waiting``: a wait in progress that the kernel has not
    credited yet (the thread stayed runnable without running, see
    :mod:`cosched.sampler.estimate`). The kernel credits a wait only when it
    ends, so a vCPU the host scheduler starves for seconds looks idle by
    ``wait`` alone; ``auto`` counts ``wait + waiting``."""

    index: int
    tid: int
    run: float
    wait: float
    waiting: float = 0.0


@dataclass(frozen=True)
class DomainView:
    uuid: str
    name: str
    vcpus: tuple[VcpuView, ...]
    hazard: float
    partial: float
    observed: float
    skew_buckets: tuple[tuple[str, int], ...]
    skew_sum: float
    skew_count: int
    last_skew: float


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


class Sampler:
    def __init__(self, fs: HostFS, interval: float, snapshot: Callable[[], Snapshot | None],
                 on_vanished: Callable[[], None] = lambda: None,
                 costop: Callable[[], dict[tuple[str, int], float]] = dict, budget: float = 0.02,
                 meter: Meter | None = None, meter_error: str | None = None):
        self.fs = fs
        self.meter = meter
        self.meter_error = meter_error           # why the meter is not in use: not loaded, or failed
        self._metered: dict[str, tuple[int, tuple[int, ...]]] = {}  # uuid -> (the meter's guest number, its tids)
        self._numbers = iter(range(1, 1 << 31))
        self.interval = interval
        self.budget = budget        # fraction of one CPU the daemon's observation may take
        self.period = interval      # the period in force (stretched to stay within the budget)
        self._cost: float | None = None   # recent CPU seconds per pass
        self.rest = 0.0             # recent CPU of the daemon's other threads, fraction of one CPU
        self.opened = 0             # vCPU threads whose descriptors were opened (a pass that opens is no guide to cost)
        self.out_of_files = False   # the last open failed for want of descriptors (logged once until one succeeds)
        self._logged = interval
        self.snapshot = snapshot
        self.on_vanished = on_vanished
        self.costop = costop
        self.domains: dict[str, DomainStats] = {}
        self.lock = threading.Lock()
        self.samples = 0
        self.late = 0               # wake-ups later than one interval
        self._last_ns: int | None = None
        self._last_snapshot: Snapshot | None = None

    # -- tracking -------------------------------------------------------
    def _open(self, pid: int, vcpu: Vcpu, host: Host) -> VcpuStats | None:
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
                self._close_fd(v, "frozen_fd")
        return v

    def _follow(self, snap: Snapshot) -> None:
        """Open descriptors for new vCPU threads, close those gone."""
        alive = {d.uuid: d for d in snap.domains}
        for uuid in list(self.domains):
            if uuid not in alive:
                self._close_domain(self.domains.pop(uuid))
        for d in snap.domains:
            stats = self.domains.setdefault(d.uuid, DomainStats(d.name))
            stats.name = d.name
            wanted = {v.index: v for v in d.vcpus}
            for index in list(stats.vcpus):
                if index not in wanted or wanted[index].tid != stats.vcpus[index].tid:
                    self._close_vcpu(stats.vcpus.pop(index))
            for index, vcpu in wanted.items():
                if index not in stats.vcpus and d.pid:
                    v = self._open(d.pid, vcpu, snap.host)
                    if v is not None:
                        stats.vcpus[index] = v
        if self.meter is not None:
            self._follow_meter({d.uuid: d.pid for d in snap.domains})

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

    def _follow_meter(self, pids: dict[str, int | None]) -> None:
        """Give the meter every domain whose vCPU threads changed (it counts
        them from now on), take away those gone."""
        try:
            for uuid in [u for u in self._metered if u not in self.domains]:
                self.meter.remove(self._metered.pop(uuid)[0])
            for uuid, stats in self.domains.items():
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
        except OSError as e:
            self._meter_off(e)

    def reconfigure(self, interval: float, budget: float) -> None:
        """A reload's sampling interval (seconds) and CPU budget (fraction of one CPU), from the next pass on."""
        self.interval, self.budget = interval, budget

    def _meter_off(self, error: OSError) -> None:
        self.meter_error = str(error)
        log.error("action=meter-off error=%r (sampling /proc instead)", self.meter_error)
        self.meter.close()
        self.meter = None
        self._metered.clear()

    @property
    def source(self) -> str:
        """``meter`` (the in-kernel meter) or ``proc`` (schedstat samples)."""
        return "meter" if self.meter is not None else "proc"

    def _costop(self, v: VcpuStats, engine: float | None) -> float:
        """Seconds the vCPU was co-stopped since the last sample: its
        cgroup's own frozen time where the kernel counts it, exact to the
        window; else the engine's count, which the switcher reports ten
        times a second, so a window gets a tenth of a second's co-stops at
        once and the ones around it none."""
        if v.frozen_fd is not None:
            try:
                frozen = read_frozen(v.frozen_fd)
            except (OSError, ValueError):      # its cgroup went: the engine's count from now on
                self._close_fd(v, "frozen_fd")
                v.costop = engine if engine is not None else v.costop
                return 0.0
        else:
            frozen = engine if engine is not None else v.costop
        d, v.costop = max(frozen - v.costop, 0.0), frozen
        return d

    @staticmethod
    def _close_fd(v: VcpuStats, name: str) -> None:
        fd = getattr(v, name)
        if fd is not None:
            os.close(fd)
            setattr(v, name, None)

    @classmethod
    def _close_vcpu(cls, v: VcpuStats) -> None:
        for name in ("fd", "stat_fd", "frozen_fd"):
            cls._close_fd(v, name)

    def _close_domain(self, d: DomainStats) -> None:
        for v in d.vcpus.values():
            self._close_vcpu(v)

    # -- sampling -------------------------------------------------------
    def step(self, now_ns: int | None = None) -> None:
        """Take one sample of every vCPU and account the window since the last."""
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        snap = self.snapshot()
        with self.lock:
            if snap is not None and snap is not self._last_snapshot:
                self._follow(snap)
                self._last_snapshot = snap
            dt = (now_ns - self._last_ns) / 1e9 if self._last_ns is not None else 0.0
            self._last_ns = now_ns
            reading = None
            if self.meter is not None:
                try:
                    reading = self.meter.read()
                except OSError as e:
                    self._meter_off(e)
            costop = self.costop() if reading is None else {}
            vanished = False
            for uuid, stats in self.domains.items():
                gone, w = (self._metered_window(uuid, stats, reading, dt) if reading is not None
                           else self._sampled_window(uuid, stats, costop, dt))
                vanished = vanished or gone
                if w is not None:
                    stats.hazard += w.hazard
                    stats.partial += w.partial
                    stats.observed += dt
                    stats.skew.observe(w.skew)
                    stats.last_skew = w.skew
            self.samples += 1
        if vanished:
            log.info("action=vcpu-vanished resync=requested")
            self.on_vanished()

    def _sampled_window(self, uuid: str, stats: DomainStats, costop: dict[tuple[str, int], float],
                        dt: float) -> tuple[bool, Window | None]:
        """One domain's window from its vCPUs' schedstat and stat (whether a
        thread vanished, the window or None)."""
        placed, stopped, cpus = [], [], []
        vanished = False
        for index in sorted(stats.vcpus):
            v = stats.vcpus[index]
            try:
                run, wait = read_schedstat(v.fd)
            except (OSError, ValueError, IndexError):
                self._close_vcpu(stats.vcpus.pop(index))
                vanished = True
                continue
            runnable, cpu = read_state(v.stat_fd)
            waiting, v.runnable = v.runnable and runnable, runnable
            stayed, v.cpu = (cpu if cpu == v.cpu else None), cpu
            d_run, d_wait = (run - v.run_ns) / 1e9, (wait - v.wait_ns) / 1e9
            v.run_ns, v.wait_ns = run, wait
            d_costop = self._costop(v, costop.get((uuid, index)))
            if dt > 0:
                placed.append(place(v.carry, d_run, d_wait, dt, waiting))
                stopped.append(min(d_costop, dt))
                cpus.append(stayed)
        if dt <= 0 or not placed:
            return vanished, None
        # a guest whose vCPUs all slept through the window (most of them, on a big host):
        # nothing to estimate, the window is one of no hazard, contention or skew
        if not any(r or w for r, w in placed) and not any(stopped):
            return vanished, Window(dt, 0.0, 0.0, 0.0)
        return vanished, estimate(dt, placed, stopped, cpus)

    def _metered_window(self, uuid: str, stats: DomainStats, reading: Reading,
                        dt: float) -> tuple[bool, Window | None]:
        """One domain's window from the meter: exact hazard and partial
        contention, and skew from each vCPU's exact lag (wait + frozen)."""
        known = self._metered.get(uuid)
        guest = reading.guests.get(known[0]) if known else None
        lags, vanished = [], False
        for index in sorted(stats.vcpus):
            v = stats.vcpus[index]
            t = reading.threads.get(v.tid)
            if t is None or t.state == DEAD:
                self._close_vcpu(stats.vcpus.pop(index))
                vanished = True
                continue
            v.run_ns, v.wait_ns = v.base[0] + int(t.run * 1e9), v.base[1] + int(t.wait * 1e9)
            lag = t.wait + t.frozen
            lags.append(lag - v.lag)
            v.lag = lag
        if guest is None or dt <= 0 or not lags:
            return vanished, None
        hazard, partial = guest.hazard - stats.metered[0], guest.partial - stats.metered[1]
        stats.metered = (guest.hazard, guest.partial)
        return vanished, Window(dt, hazard, partial, max(lags) - min(lags))

    def stretch(self, cost: float | None, rest: float | None = None, elapsed: float = 0.0) -> float:
        """Take one pass's CPU seconds (None: not a guide) and the CPU fraction
        the daemon's other threads used over the last ``elapsed`` seconds;
        return the period that keeps the daemon within the budget."""
        if cost is not None:
            self._cost = cost if self._cost is None else self._cost + 0.1 * (cost - self._cost)
        if rest is not None and elapsed > 0:      # over the last REST_AVERAGE_S
            self.rest += (1 - math.exp(-elapsed / REST_AVERAGE_S)) * (rest - self.rest)
        share = max(self.budget - self.rest, self.budget / 2)
        self.period = max(self.interval, (self._cost or 0.0) / share)
        if abs(self.period - self._logged) > 0.2 * self._logged:        # state changes only
            log.info("action=sample-period period_ms=%.0f interval_ms=%.0f pass_ms=%.2f budget_pct=%g rest_pct=%.2f",
                     1000 * self.period, 1000 * self.interval, 1000 * (self._cost or 0.0), 100 * self.budget,
                     100 * self.rest)
            self._logged = self.period
        return self.period

    def run(self, stop: threading.Event) -> None:
        """Sample every ``period`` on an absolute schedule until ``stop``."""
        deadline = time.monotonic_ns()
        last = None              # (this thread's CPU, wall, the process's CPU) when the last pass ended
        while not stop.is_set():
            opened = self.opened
            try:
                self.step()
            except Exception:  # never let one bad sample end sampling
                log.exception("action=sample-failed")
            ended = (time.thread_time(), time.monotonic(), time.process_time())
            cost = rest = None
            elapsed = ended[1] - last[1] if last else 0.0
            if last and elapsed > 0:    # since the last pass ended: this thread (its wake-up and this pass), the others
                own = ended[0] - last[0]
                cost = own if self.opened == opened else None
                rest = max(ended[2] - last[2] - own, 0.0) / elapsed
            last = ended
            period = int(self.stretch(cost, rest, elapsed) * 1e9)   # a reload may change the interval
            deadline += period
            now = time.monotonic_ns()
            if now > deadline:
                self.late += 1
                deadline = now + period if now - deadline > 10 * period else deadline
            stop.wait(max(deadline - time.monotonic_ns(), 0) / 1e9)
        with self.lock:
            for d in self.domains.values():
                self._close_domain(d)
            if self.meter is not None:
                self.meter.close()

    def view(self) -> dict[str, DomainView]:
        """A consistent copy of the accumulated figures, by domain UUID."""
        with self.lock:
            return {
                uuid: DomainView(
                    uuid=uuid,
                    name=d.name,
                    vcpus=tuple(VcpuView(i, v.tid, v.run_ns / 1e9, v.wait_ns / 1e9, v.carry.advance)
                                for i, v in sorted(d.vcpus.items())),
                    hazard=d.hazard,
                    partial=d.partial,
                    observed=d.observed,
                    skew_buckets=tuple(d.skew.buckets()),
                    skew_sum=d.skew.total,
                    skew_count=sum(d.skew.counts),
                    last_skew=d.last_skew,
                )
                for uuid, d in self.domains.items()
            }
