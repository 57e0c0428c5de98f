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
it), keeps descriptors open per vCPU thread (:mod:`.proc`), and samples on an
absolute-time schedule so a late wake-up shortens the next sleep instead of
drifting. How each figure is estimated, and its error bound, is in
:mod:`cosched.sampler.estimate`.
A thread that is gone (ESRCH/ENOENT) is dropped and ``on_gone`` asks
discovery for a resync.

A vCPU's lag counts the time cosched held it co-stopped. Where the kernel
counts a cgroup's frozen time (``frozen_usec`` in ``cgroup.stat.local``,
Linux 6.17 on) the sampler reads it from each vCPU's own cgroup with the
rest, so each window gets exactly the co-stops in it; before, it takes the
engine's count, which comes ten times a second (a window then gets a tenth
of a second's co-stops at once: ``relaxed``'s skew, one vCPU co-stopped
at a time, read 2.6-4.4x the kernel trace's that way; docs/reference/metrics.md).

Where the in-kernel meter runs (:mod:`cosched.sampler.meter`, followed
through :mod:`.metered`; config key ``meter``), a pass reads it instead of
``/proc``: every thread's run, wait
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
import threading
import time
from typing import Callable

from cosched.hostfs import HostFS
from cosched.model import Snapshot
from cosched.sampler.meter import Meter
from cosched.sampler.metered import Metered
from cosched.sampler.proc import Proc, close_vcpu
from cosched.sampler.records import DomainStats, DomainView, VcpuView

__all__ = ["Sampler", "DomainView", "VcpuView"]

log = logging.getLogger("cosched.sampler")

REST_AVERAGE_S = 10.0     # the rest of the daemon is bursty (a resync every 5 s): averaged over this long


class Sampler:
    def __init__(self, fs: HostFS, interval: float, snapshot: Callable[[], Snapshot | None],
                 on_gone: Callable[[], None] = lambda: None,
                 costop: Callable[[], dict[tuple[str, int], float]] = dict, budget: float = 0.02,
                 meter: Meter | None = None, meter_error: str | None = None):
        self.fs = fs
        self.proc = Proc(fs)
        self.metered = Metered(fs, meter) if meter is not None else None
        self.meter_error = meter_error           # why the meter is not in use: not loaded, or failed
        self.interval = interval
        self.budget = budget        # fraction of one CPU the daemon's observation may take
        self.period = interval      # the period in force (stretched to stay within the budget)
        self._cost: float | None = None   # recent CPU seconds per pass
        self.rest = 0.0             # recent CPU of the daemon's other threads, fraction of one CPU
        self._logged = interval
        self.snapshot = snapshot
        self.on_gone = on_gone
        self.costop = costop
        self.domains: dict[str, DomainStats] = {}
        self.lock = threading.Lock()
        self.samples = 0
        self.late = 0               # wake-ups later than one interval
        self._last_ns: int | None = None
        self._last_snapshot: Snapshot | None = None

    @property
    def out_of_files(self) -> bool:
        """The last vCPU thread opened failed for want of descriptors."""
        return self.proc.out_of_files

    @property
    def source(self) -> str:
        """``meter`` (the in-kernel meter) or ``proc`` (schedstat samples)."""
        return "meter" if self.metered is not None else "proc"

    def reconfigure(self, interval: float, budget: float) -> None:
        """A reload's sampling interval (seconds) and CPU budget (fraction of one CPU), from the next pass on."""
        self.interval, self.budget = interval, budget

    # -- tracking -------------------------------------------------------
    def _follow(self, snap: Snapshot) -> None:
        """Open descriptors for new vCPU threads, close those gone."""
        alive = {d.uuid: d for d in snap.domains}
        for uuid in list(self.domains):
            if uuid not in alive:
                for v in self.domains.pop(uuid).vcpus.values():
                    close_vcpu(v)
        for d in snap.domains:
            stats = self.domains.setdefault(d.uuid, DomainStats(d.name))
            stats.name = d.name
            wanted = {v.index: v for v in d.vcpus}
            for index in list(stats.vcpus):
                if index not in wanted or wanted[index].tid != stats.vcpus[index].tid:
                    close_vcpu(stats.vcpus.pop(index))
            for index, vcpu in wanted.items():
                if index not in stats.vcpus and d.pid:
                    v = self.proc.open(d.pid, vcpu, snap.host)
                    if v is not None:
                        stats.vcpus[index] = v
        if self.metered is not None:
            try:
                self.metered.follow(self.domains, {d.uuid: d.pid for d in snap.domains})
            except OSError as e:
                self._meter_off(e)

    def _meter_off(self, error: OSError) -> None:
        self.meter_error = str(error)
        log.error("action=meter-off error=%r (sampling /proc instead)", self.meter_error)
        self.metered.close()
        self.metered = None

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
            if self.metered is not None:
                try:
                    reading = self.metered.read()
                except OSError as e:
                    self._meter_off(e)
            costop = self.costop() if reading is None else {}
            any_gone = False
            for uuid, stats in self.domains.items():
                gone, w = (self.metered.window(uuid, stats, reading, dt) if reading is not None
                           else self.proc.window(uuid, stats, costop, dt))
                any_gone = any_gone or gone
                if w is not None:
                    stats.hazard += w.hazard
                    stats.partial += w.partial
                    stats.observed += dt
                    stats.until = now_ns / 1e9
                    stats.skew.observe(w.skew)
                    stats.last_skew = w.skew
            self.samples += 1
        if any_gone:
            log.info("action=vcpu-gone resync=requested")
            self.on_gone()

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
            opened = self.proc.opened
            try:
                self.step()
            except Exception:  # never let one bad sample end sampling
                log.exception("action=sample-failed")
            ended = (time.thread_time(), time.monotonic(), time.process_time())
            cost = rest = None
            elapsed = ended[1] - last[1] if last else 0.0
            if last and elapsed > 0:    # since the last pass ended: this thread (its wake-up and this pass), the others
                own = ended[0] - last[0]
                cost = own if self.proc.opened == opened else None
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
                for v in d.vcpus.values():
                    close_vcpu(v)
            if self.metered is not None:
                self.metered.close()

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
                    until=d.until,
                )
                for uuid, d in self.domains.items()
            }
