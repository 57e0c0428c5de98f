"""The switch loop: turns each cell's slot table into freeze/thaw and boosts, on
time, and watches ``boost`` and ``relaxed`` guests.

It runs as its own process (``python -m cosched.engine.switcher``), started
and fed by the daemon, for two reasons measured on real hosts: a Python thread
sharing the daemon's interpreter can be held up to the GIL switch interval
(5 ms) by busy sibling threads, and while boosted vCPUs occupy every CPU an
ordinary (CFS) thread may not run at all. The switcher is single-threaded and
raises itself to SCHED_FIFO above every vCPU boost, so it always gets the CPU
at a slot boundary.

How it works, with the measurements behind it: ``docs/design/switcher.md``.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from cosched.actuators.admission import SETTLE_MAX_NS, Admission
from cosched.actuators.freezer import Freezer
from cosched.actuators.journal import GONE
from cosched.actuators.rt_runtime import RtGrants
from cosched.actuators.sched import SchedAttr, SchedKnob
from cosched import logs
from cosched.engine import protocol as pr
from cosched.hostfs import FD_SETSIZE, OUT_OF_FILES, HostFS
from cosched.kernel import on_cpu, parse_schedstat, stat_runnable_cpu
from cosched.policy.plan import WATCHED
from cosched.policy.watch import Bcs, Relaxed, Seen, on_cpu_unchanged
from cosched.sampler.meter import LongWaits, MeterUnavailable

log = logging.getLogger("cosched.switcher")
STATS_EVERY_NS = int(pr.STATS_EVERY_S * 1e9)
IDLE_STATS_EVERY_NS = int(pr.IDLE_STATS_EVERY_S * 1e9)
WATCH_POLL_NS = 500_000      # 1 ms co-ran siblings measurably less often (barrier guests, 2-CPU host)
LONG_WAIT_NS = WATCH_POLL_NS  # a wait the meter reports long: as long as the shortest two looks can tell
BOOST_MARGIN_NS = 2_000_000
MAX_SHARE = 0.5               # of a CPU, per boost (boost_share)
FAIR_SERVER_SHARE = 0.05      # the deadline server that keeps CFS tasks running (Linux 6.12+: 50 ms per second per CPU)
STILL_WAIT_S = 0.002         # a vCPU kept still for a return from a boost: it freezes in about 0.1 ms
FREEZE_WAIT_S = 0.05         # a TCG vCPU freezes in about 0.1 ms; 64 spinning ones on 2 CPUs in under 4 ms
ADMISSION_CHECK_NS = 1_000_000_000   # the deadline admission total is checked at most this often,
REFUSED_CHECK_NS = 100_000_000       # and this often after a refused boost when nothing need be waited for


def boost_attr(boost_ms: float, share: float = MAX_SHARE) -> SchedAttr:
    """The attributes of a watched deadline boost: ``boost_ms`` of runtime
    plus :data:`BOOST_MARGIN_NS`, in a period that holds it to ``share`` of a
    CPU (the kernel enforces it even if cosched stops answering). Why these
    figures: ``docs/design/switcher.md`` (*The boost*)."""
    runtime = int(boost_ms * 1_000_000) + BOOST_MARGIN_NS
    period = int(runtime / share)
    return SchedAttr("deadline", runtime_ns=runtime, deadline_ns=period, period_ns=period)


FALLBACK_BOOST = SchedAttr("fifo", priority=1)
FIFO_BUDGET_SHARE = 0.9      # of a vCPU's RT runtime, for its SCHED_FIFO boosts within deadline boosts' periods


def rt_granted(m: pr.MemberPlan) -> bool:
    """Whether the plan grants RT runtime to this member's vCPU cgroups
    (RT group scheduling kernels)."""
    return bool(m.rt_vcpu_us) and any(v.rt_chain for v in m.vcpus)


def fifo_budget_ns(m: pr.MemberPlan) -> int | None:
    """The time a ``boost`` guest's vCPU may spend in SCHED_FIFO boosts per
    RT period (:class:`cosched.policy.watch.Bcs`): nine tenths of the RT
    runtime granted to its cgroup on kernels with RT group scheduling,
    past which the kernel throttles it: a sampler of the kernel's RT run
    queues, every 0.1 s, found a vCPU group throttled in 31 samples of a
    run of every workload without this bound, in none of two runs with it
    (``docs/decisions/0011-fifo-boosts-within-a-deadline-period.md``). No bound elsewhere."""
    return int(m.rt_vcpu_us * 1000 * FIFO_BUDGET_SHARE) if rt_granted(m) else None


def fresh_ns(boost_ms: float, share: float) -> int:
    """How long after a boost took effect (the clock read once the call
    returned) its vCPU may be boosted afresh (:func:`boost_attr`): the
    reservation's period, by then over, and a poll to spare. Counted from
    before the call instead, a boost can come microseconds before the last
    one's deadline, inherit it, outlive it and so leave through the zero
    reservation with its deadline passed: the test of forty boosts
    (``tests/kernel/test_sched.py``) counted so failed twice in 18 runs, once
    with a boost that waited 4.2 s (none in 25 runs since)."""
    return boost_attr(boost_ms, share).period_ns + WATCH_POLL_NS


def boost_share(fs: HostFS) -> float:
    """The share of a CPU each boost holds: nine tenths of what the kernel's
    deadline admission allows per CPU (``sched_rt_runtime_us`` per
    ``sched_rt_period_us``, 95% by default, less the fair server's 5% on
    kernels from 6.12), at most :data:`MAX_SHARE`. No more boosts run at
    once than the pool has CPUs, and a boost's bandwidth leaves the
    admission total as the boost ends (the zero reservation), so that much
    is always admitted. Half a CPU at most: a vCPU boosted when its switcher
    is killed keeps its reservation until the daemon restores it, and takes
    no more than that meanwhile; and the period, which sets the least time
    between two boosts of a vCPU, is then twice the boost."""
    runtime = (fs.read_or("/proc/sys/kernel/sched_rt_runtime_us") or "").strip()
    period = (fs.read_or("/proc/sys/kernel/sched_rt_period_us") or "").strip()
    limit = 1.0 if runtime == "-1" else (int(runtime) / int(period) if runtime.isdigit() and period.isdigit()
                                         and int(period) else 0.95)
    return max(min(MAX_SHARE, 0.9 * (limit - FAIR_SERVER_SHARE)), 0.01)


@dataclass
class VState:
    """What the switcher did to one vCPU thread."""

    frozen: bool = False
    frozen_since: int = 0
    credited: int = 0            # co-stop time counted up to here
    boosted: bool = False


@dataclass
class Watched:
    """One watched guest: its rules, and descriptors of its vCPU threads."""

    cell: str
    plan: pr.MemberPlan
    rules: object                            # policy.watch.Bcs or Relaxed
    fds: list[tuple[int, int, int] | None]   # (stat, schedstat, status) per vCPU
    keys: tuple[tuple, ...]                  # per vCPU, as MemberState.keys (computed once: polled 2,000 times a second)
    boost_failed: str | None = None
    refused: dict[int, int] = field(default_factory=dict)    # vCPU index -> errno of its refused SCHED_DEADLINE
                                                             # boost (EPERM: pinned to a subset); it takes the
                                                             # SCHED_FIFO fallback at once while this plan (its
                                                             # pinning) holds (Bcs.fifo_only)
    seen: list[Seen | None] = field(default_factory=list)    # the last look's
    due: int = 0                                             # when its next look is (monotonic ns)
    long: set[int] = field(default_factory=set)              # vCPUs reported in a long wait since the last look
    told: bool = False                                       # its long waits are reported (Switcher._tell)


@dataclass
class MemberState:
    plan: pr.MemberPlan

    @property
    def uuid(self) -> str:
        return self.plan.uuid

    def keys(self) -> list[tuple]:
        """One key per vCPU thread and cgroup: a new TID or path is a new vCPU."""
        return [(self.plan.uuid, v.index, v.tid, v.freeze) for v in self.plan.vcpus]


@dataclass
class CellState:
    id: str
    mode: str
    members: list[MemberState]
    active: int = 0
    deadline: int | None = None
    boost_failed: str | None = None


@dataclass
class Counters:
    switches: dict[str, int] = field(default_factory=dict)
    latency_ns: list[int] = field(default_factory=list)
    lateness_ns: list[int] = field(default_factory=list)
    costop_ns: dict[tuple[str, int], int] = field(default_factory=dict)     # (uuid, vcpu) -> ns
    costops: dict[tuple[str, int], int] = field(default_factory=dict)
    boosts: dict[tuple[str, int], int] = field(default_factory=dict)
    held: Counter = field(default_factory=Counter)      # long waits of watched guests not boosted, by why
    reported: int = 0                                   # long waits the meter reported of guests watched
    forced_thaws: int = 0
    errors: list[str] = field(default_factory=list)

    @staticmethod
    def add(per_vcpu: dict, key: tuple, n: int = 1) -> None:
        """Count ``n`` for the vCPU a switcher key names (its uuid and index)."""
        per_vcpu[key[:2]] = per_vcpu.get(key[:2], 0) + n


class Switcher:
    """The slot tables of every cell, turned into freeze/thaw and boosts.

    ``sched`` applies scheduling attributes (a :class:`SchedKnob`, or one
    a test builds on fake system calls); ``clock`` gives monotonic ns;
    ``admission`` checks and recounts the kernel's deadline admission total
    (an :class:`Admission` through ``sched``'s system call by default).
    """

    def __init__(self, fs: HostFS, max_stall_ns: int, rt_top_us: int | None = None,
                 sched=None, clock: Callable[[], int] = time.monotonic_ns, admission: Admission | None = None,
                 long_waits=None):
        self.fs = fs
        self.long_waits = long_waits                 # the meter's long-wait reports (LongWaits), or None
        if long_waits is not None:
            long_waits.set_after(LONG_WAIT_NS)
        self._told: dict[int, tuple[str, int]] = {}  # reported thread -> (uuid of its watch, vCPU index)
        self.max_stall_ns = max_stall_ns
        self.rt_top_us = rt_top_us
        self.sched = sched if sched is not None else SchedKnob(fs, clock=clock)
        self.clock = clock
        self.cells: dict[str, CellState] = {}
        self.vstate: dict[tuple, VState] = {}
        self.vinfo: dict[tuple, tuple[str, pr.VcpuPlan]] = {}       # key -> (domain name, vCPU plan)
        self.rt = RtGrants(fs, self._error)
        self._stranded_told = 0
        self.admission_wrong: bool | None = None     # None: not checked yet
        self.exits: dict[int, tuple] = {}            # exit descriptor -> key of a vCPU holding RT runtime
        self.gone: set[tuple] = set()                # vCPUs seen to exit: their guests' runtime given back
        self.freezer = Freezer(fs)
        self.counters = Counters()
        self._reported: set[str] = set()
        self.watched: dict[str, Watched] = {}      # uuid -> watch
        self.max_boosted = 0
        self.share = boost_share(fs)                 # of a CPU, per boost
        self.next_poll: int | None = None
        self._turn = 0                               # which watched guest a poll serves first
        self.admission = admission if admission is not None else Admission(fs, put=self.sched.set)
        self._checked = 0                            # releases up to here are covered by a check
        self._last_check = clock()                   # when the total was last checked (monotonic ns): the
                                                     # daemon checked it when it started (Engine.recover)
        self._refused = False                        # a boost was refused since the last check
        self.settling: int | None = None             # since when no boost starts: the total is checked then

    # -- errors never stop the loop --------------------------------------
    def _error(self, message: str) -> None:
        if message not in self._reported:
            self._reported.add(message)
            self.counters.errors.append(message)
            log.warning("action=error %s", message)

    # -- per-vCPU actions -------------------------------------------------
    def _freeze(self, key, frozen: bool, now: int) -> None:
        st = self.vstate.setdefault(key, VState())
        name, v = self.vinfo[key]
        if st.frozen == frozen or not v.freeze:
            return
        try:
            self.freezer.set(v.freeze, frozen)
        except OSError as e:
            if e.errno not in GONE:
                self._error(f"domain={name} vcpu={v.index} freeze={frozen}: {os.strerror(e.errno)}")
            return
        if frozen:
            st.frozen, st.frozen_since, st.credited = True, now, now
        else:
            self.counters.add(self.counters.costop_ns, key, max(now - st.credited, 0))
            st.frozen = False

    def _grant(self) -> None:
        """Hold the RT runtime every boosted member needs (RT group scheduling only).

        A ``boost`` guest's grant serves its SCHED_FIFO boosts (those
        within a deadline boost's period, and those of a vCPU refused
        SCHED_DEADLINE); without it, it boosts with SCHED_DEADLINE only,
        which needs no RT runtime. Each vCPU
        holding runtime has an exit descriptor: once one exits, its guest's
        runtime is given back at once, before libvirt removes the guest's
        cgroups (a removed group keeps its runtime counted: see
        :mod:`cosched.actuators.rt_runtime`). Measured on a destroyed guest:
        given back 1.8 s before libvirt's event that it stopped.
        """
        owners: list[tuple[CellState | Watched, pr.MemberPlan, str, list]] = [
            (cell, m.plan, cell.id, m.keys()) for cell in self.cells.values() for m in cell.members if m.plan.priority]
        owners += [(w, w.plan, w.cell, list(w.keys)) for w in self.watched.values()
                   if w.plan.boost_ms]
        owners = [o for o in owners if rt_granted(o[1]) and not o[0].boost_failed]
        self._watch_exits([k for o in owners for k in o[3]])
        wanted: dict[str, int] = {}
        owner: dict[str, tuple[CellState | Watched, str]] = {}
        for who, p, cid, keys in owners:
            if any(k in self.gone for k in keys):
                continue
            chains = [v.rt_chain for v in p.vcpus if v.rt_chain]
            for c in chains:
                wanted[c[0]] = max(wanted.get(c[0], 0), self.rt_top_us or 0)
                for path in c[1:-1]:
                    wanted[path] = p.rt_vcpu_us * len(p.vcpus)
                wanted[c[-1]] = p.rt_vcpu_us
                for path in c:
                    owner[path] = (who, cid)
        for path in sorted(self.rt.grant(wanted)):
            who, cid = owner[path]
            if isinstance(who, Watched) and isinstance(who.rules, Bcs):
                self._fifo_off(who, f"RT runtime grant {path} failed")
            elif not who.boost_failed:
                who.boost_failed = f"RT runtime grant {path} failed; {cid} runs " + (
                    "without boosts" if isinstance(who, Watched) else "freeze-only")
                self._error(who.boost_failed)

    def _fifo_off(self, w: Watched, why: str) -> None:
        """A ``boost`` guest that cannot have SCHED_FIFO boosts: from now on
        it boosts a vCPU only when a deadline boost is allowed (said once)."""
        if w.rules.fifo:
            w.rules.fifo = False
            self._error(f"domain={w.plan.name}: {why}; {w.cell} boosts with SCHED_DEADLINE only, "
                        "a vCPU again once its last boost's period is over")

    def _watch_exits(self, keys: list) -> None:
        """Keep an exit descriptor for exactly these vCPUs (those holding RT runtime)."""
        keep = set(keys)
        for fd, k in list(self.exits.items()):
            if k not in keep:
                del self.exits[fd]
                os.close(fd)
        watching = set(self.exits.values())
        for k in keep - watching - self.gone:
            try:
                fd = self.fs.exit_fd(k[2])
            except ProcessLookupError:
                self.gone.add(k)
                continue
            if fd is not None and fd >= FD_SETSIZE:
                os.close(fd)
                self._error(f"domain={self.vinfo[k][0]} vcpu={k[1]}: too many open descriptors to watch its "
                            f"exit; its RT runtime goes back only when the daemon sees the guest gone")
            elif fd is not None:
                self.exits[fd] = k
        self.gone &= keep

    def exited(self, fd: int) -> None:
        """A vCPU holding RT runtime exited: its guest gives its runtime back now."""
        key = self.exits.pop(fd, None)
        os.close(fd)
        if key is None:
            return
        self.gone.add(key)
        for k in [k for k in self.vinfo if k[0] == key[0]]:
            self._unboost(k)                 # no RT thread may stay in a group losing its runtime
        log.info("domain=%s vcpu=%d action=exited rt=given-back", self.vinfo.get(key, (key[0],))[0], key[1])
        self._grant()

    def _boost_member(self, cell: CellState, m: MemberState) -> None:
        if not m.plan.priority or cell.boost_failed or any(k in self.gone for k in m.keys()):
            return
        try:
            for k in m.keys():
                if not self.vstate.setdefault(k, VState()).boosted:
                    self.sched.apply(k[2], SchedAttr("fifo", priority=m.plan.priority))
                    self.vstate[k].boosted = True
        except OSError as e:
            if e.errno in GONE:
                return
            cell.boost_failed = (f"boost impossible for domain {m.plan.name}: {os.strerror(e.errno)}; "
                                 f"cell {cell.id} runs freeze-only")
            self._error(cell.boost_failed)
            self._unboost_member(m)

    def _unboost(self, key) -> None:
        """Return a boosted thread to exactly the attributes recorded for it."""
        st = self.vstate.get(key)
        if st is None or not st.boosted:
            return
        name, v = self.vinfo[key]
        try:
            self.sched.apply(v.tid, v.original, still=(lambda: self._still(key)) if v.freeze else None)
        except OSError as e:
            if e.errno not in GONE:
                self._error(f"domain={name} vcpu={v.index} unboost to {v.original}: {os.strerror(e.errno)}")
                return
        st.boosted = False

    @contextlib.contextmanager
    def _still(self, key):
        """Keep a vCPU from running (its cgroup frozen, unless it is already)
        while its boost is taken back through the zero reservation: one
        that woke between the two calls ran at that reservation's rate and
        was held back by its next boosts (:mod:`cosched.actuators.sched`).
        A watched guest never has every vCPU frozen at once: when all its
        other vCPUs are co-stopped, one co-stop ends first."""
        st, (name, v) = self.vstate.get(key), self.vinfo[key]
        if st is not None and st.frozen:
            yield
            return
        w = self.watched.get(key[0])
        others = [k for k in w.keys if k != key] if w is not None else []
        if others and all(k in self.vstate and self.vstate[k].frozen for k in others):
            self._freeze(others[0], False, self.clock())

        def thaw_failed(e: OSError) -> None:
            if e.errno not in GONE:
                self._error(f"domain={name} vcpu={v.index} thaw after unboost: {os.strerror(e.errno)}")
        with self.freezer.still(v.freeze, STILL_WAIT_S, thaw_failed):
            yield

    def _unboost_member(self, m: MemberState) -> None:
        for k in m.keys():
            self._unboost(k)

    def _release(self, keys: list, now: int) -> None:
        """Thaw these vCPUs, unboost them, then take back their RT runtime, and forget them."""
        for k in keys:
            self._freeze(k, False, now)
        for k in keys:
            self._unboost(k)
        self.rt.release([p for k in keys for p in self.vinfo[k][1].rt_chain[1:]])   # the top stays
        for k in keys:
            self.vstate.pop(k, None)
            self.freezer.forget(self.vinfo.pop(k)[1].freeze)

    # -- watched guests (boost, relaxed) ----------------------------------
    def _watch(self, cell: pr.CellPlan, m: pr.MemberPlan) -> Watched:
        n = len(m.vcpus)
        if cell.mode == "relaxed":
            rules = Relaxed(n, int(m.costop_ms * 1e6), int(m.costart_ms * 1e6), int(m.boost_ms * 1e6),
                            int(m.pause_ms * 1e6), fresh_ns(m.boost_ms, self.share), WATCH_POLL_NS)
        else:
            rules = Bcs(n, int(m.boost_ms * 1e6), int(m.pause_ms * 1e6), fresh_ns(m.boost_ms, self.share), fifo=True,
                        fifo_budget_ns=fifo_budget_ns(m))
        for i, v in enumerate(m.vcpus):      # returned from a deadline boost lately, here or by the daemon
            rules.hold(i, max(v.quiet_until, self.sched.quiet_until(v.tid)))
        fds = []
        for v in m.vcpus:
            opened: list[int] = []
            try:
                for f in ("stat", "schedstat", "status"):
                    opened.append(self.fs.open_fd(f"/proc/{v.tid}/{f}"))
                fds.append(tuple(opened))
            except OSError as e:
                for fd in opened:
                    os.close(fd)
                fds.append(None)                       # gone: discovery will notice
                if e.errno in OUT_OF_FILES:
                    self._error(f"domain={m.name} vcpu={v.index}: {e.strerror}: the guest is not watched")
        log.info("domain=%s action=watch mode=%s", m.name, cell.mode)
        return Watched(cell.id, m, rules, fds, tuple(MemberState(m).keys()))

    def _tell(self, w: Watched) -> None:
        """Have the meter report the long waits of a ``boost`` guest while it
        is calm (looked at less often than every poll), and not otherwise:
        a guest looked at every poll has its long waits seen within a poll
        of their start anyway, and reports would only add wake-ups."""
        if self.long_waits is None or not isinstance(w.rules, Bcs) or (w.rules.every > 1) == w.told:
            return
        w.told = not w.told
        m = w.plan
        try:
            for v in m.vcpus:
                if w.told:
                    self.long_waits.watch(v.tid)
                    self._told[v.tid] = (m.uuid, v.index)
                else:
                    self._untell(v.tid)
        except OSError as e:              # left told, with nothing reported: tried again at its next calm
            for v in m.vcpus:
                self._untell(v.tid)
            self._error(f"domain={m.name}: {e}; its long waits are found by looks alone")

    def _untell(self, tid: int) -> None:
        if self._told.pop(tid, None) is not None:
            self.long_waits.unwatch(tid)

    def told(self, now: int) -> None:
        """Take the meter's reports of long waits: each one's guest is looked at now."""
        for tid in self.long_waits.take():
            uuid, i = self._told.get(tid, (None, None))    # an entry lives as long as its watch
            w = self.watched.get(uuid)
            if w is not None:
                self.counters.reported += 1
                w.long.add(i)
                w.due = now
                self.next_poll = now

    def _unwatch(self, w: Watched, now: int) -> None:
        """Stop watching: thaw and unboost its vCPUs, close its descriptors."""
        for v in w.plan.vcpus:
            self._untell(v.tid)
        for k in w.keys:
            if k in self.vinfo:
                self._freeze(k, False, now)
                self._unboost(k)
        for v in w.plan.vcpus:
            self.sched.forget(v.tid)
        for fds in w.fds:
            for fd in fds or ():
                os.close(fd)
        w.fds = []

    @staticmethod
    def _see(fds: tuple[int, int, int] | None, before: Seen | None) -> Seen | None:
        if fds is None:
            return None
        try:
            run, _, switch_ins = parse_schedstat(os.pread(fds[1], 128, 0))
            if before is not None and before.on_cpu and on_cpu_unchanged(before, True, run, switch_ins):
                return before            # on a CPU and not switched out since: stat not read (the hot path)
            runnable, cpu = stat_runnable_cpu(os.pread(fds[0], 1024, 0))
            on = on_cpu_unchanged(before, runnable, run, switch_ins)
            if on is None:
                on = on_cpu(switch_ins, os.pread(fds[2], 16384, 0))
            return Seen(runnable, cpu, run, switch_ins, on)
        except (OSError, ValueError):
            return None

    def _boost_watched(self, w: Watched, i: int, fifo: bool) -> bool:
        """Boost vCPU ``i`` of ``w``: SCHED_DEADLINE, or SCHED_FIFO where its
        rules ask (``fifo``) or SCHED_DEADLINE was refused."""
        key = w.keys[i]
        st = self.vstate.setdefault(key, VState())
        if st.boosted:
            return True
        tid = w.plan.vcpus[i].tid
        if i not in w.refused and not fifo:
            try:
                self.sched.apply(tid, boost_attr(w.plan.boost_ms, self.share))
                w.rules.started(i, self.clock())   # the boost began before this
                stale = not self.sched.fresh(tid)
            except OSError as e:
                if e.errno in GONE:
                    return False
                if e.errno == errno.EBUSY:
                    # deadline admission control is full for now (other deadline tasks, or an
                    # old boost's bandwidth not yet released), or its total is wrong: skip this one,
                    # not the guest, and have the total checked (a boost refused adds nothing to release)
                    self.counters.held["refused"] += 1
                    self._refused = True
                    return False
                w.refused[i] = e.errno
                if isinstance(w.rules, Bcs):
                    w.rules.fifo_only(i)          # its boosts count against its RT runtime budget
        if i in w.refused or fifo:
            try:
                self.sched.apply(tid, FALLBACK_BOOST)     # e.g. pinned to a subset: no SCHED_DEADLINE
            except OSError as e:
                if e.errno in GONE:
                    return False
                if i in w.refused:
                    w.boost_failed = (f"boost impossible for domain {w.plan.name}: {os.strerror(w.refused[i])} for "
                                      f"SCHED_DEADLINE, {os.strerror(e.errno)} for SCHED_FIFO; "
                                      f"{w.cell} runs without boosts")
                    self._error(w.boost_failed)
                else:
                    self._fifo_off(w, f"{os.strerror(e.errno)} for SCHED_FIFO")
                return False
            stale = False
        st.boosted = True
        if stale:
            self._unboost(key)              # it would not run while boosted: back now, held as the knob says
            w.rules.hold(i, self.sched.quiet_until(tid))
            self.counters.held["stale"] += 1
            return st.boosted
        self.counters.add(self.counters.boosts, key)
        return True

    def poll(self, now: int) -> None:
        """One look at every watched vCPU, and the rules' answer carried out."""
        room = 0 if self.settling is not None else self.max_boosted - sum(
            1 for w in self.watched.values() for k in w.keys if k in self.vstate and self.vstate[k].boosted)
        order = list(self.watched.values())          # each poll another guest first: the room is shared
        self._turn = (self._turn + 1) % len(order) if order else 0
        for w in order[self._turn:] + order[:self._turn]:
            if w.due > now + WATCH_POLL_NS // 4:      # not due (guests due about now share this wake-up)
                continue
            rules = w.rules
            seen = [self._see(fds, before) for fds, before in zip(w.fds, w.seen or [None] * len(w.fds))]
            w.seen = seen
            if not seen or any(s is None for s in seen):
                w.due = now + rules.next_in * WATCH_POLL_NS
                continue
            keys = w.keys
            if isinstance(rules, Relaxed):      # a forced thaw ends a co-stop too
                for v, k in zip(rules.vcpus, keys):
                    v.frozen = k in self.vstate and self.vstate[k].frozen
            if w.long:                          # reported: only boost guests' are (Bcs)
                acts = rules.step(now, seen, 0 if w.boost_failed else max(room, 0), long=w.long)
                w.long = set()
            else:
                acts = rules.step(now, seen, 0 if w.boost_failed else max(room, 0))
            self._tell(w)
            w.due = now + rules.next_in * WATCH_POLL_NS
            if not w.boost_failed:
                held = dict(acts.held)
                if self.settling is not None and "room" in held:    # no room: the admission total is checked
                    held["check"] = held.pop("room")
                self.counters.held.update(held)
            for i in acts.unboost:
                self._unboost(keys[i])
                rules.hold(i, self.sched.quiet_until(w.plan.vcpus[i].tid))
                room += 1
            for i in acts.thaw:
                self._freeze(keys[i], False, now)
            for i in acts.freeze:
                self._freeze(keys[i], True, now)
                if self.vstate[keys[i]].frozen:
                    self.counters.add(self.counters.costops, keys[i])
            # In the rules' order, also where a deadline boost of a vCPU queued on the switcher's own CPU
            # preempts it (SCHED_DEADLINE is above its SCHED_FIFO) and so delays the boosts after it:
            # applying those last served barrier and pingpong guests worse and cost more CPU (the
            # switcher, no longer held off, looked more often; docs/decisions/0011-fifo-boosts-within-a-deadline-period.md).
            for i in acts.boost:
                if self._boost_watched(w, i, i in acts.fifo):
                    room -= 1
                else:
                    rules.cancel(i)

    # -- plans ----------------------------------------------------------
    def apply(self, msg: pr.Plan) -> None:
        """Adopt a new plan, keeping each cell's rotation where it can."""
        now = self.clock()
        self.max_stall_ns = int(msg.max_stall_ms * 1_000_000)
        self.rt_top_us = msg.rt_top_us
        old = self.cells
        cells: dict[str, CellState] = {}
        watched: dict[str, Watched] = {}
        for c in msg.cells:
            if c.mode in WATCHED:
                for m in c.members:
                    prev = self.watched.pop(m.uuid, None)
                    if prev is not None and (prev.plan, prev.cell) == (m, c.id):
                        watched[m.uuid] = prev
                        continue
                    if prev is not None:
                        self._unwatch(prev, now)
                    watched[m.uuid] = self._watch(c, m)
                    for v, k in zip(m.vcpus, watched[m.uuid].keys):
                        self.vinfo[k] = (m.name, v)
                continue
            members = [MemberState(m) for m in c.members]
            cell = CellState(c.id, c.mode, members)
            prev = old.get(c.id)
            if prev is not None and prev.members:
                active_uuid = prev.members[prev.active].uuid
                ids = [m.uuid for m in members]
                if active_uuid in ids:
                    cell.active, cell.deadline = ids.index(active_uuid), prev.deadline
                cell.boost_failed = prev.boost_failed
            cells[c.id] = cell
            for m in members:
                for v, k in zip(m.plan.vcpus, m.keys()):
                    self.vinfo[k] = (m.plan.name, v)
        for w in self.watched.values():
            self._unwatch(w, now)
        wanted = {k for c in cells.values() for m in c.members for k in m.keys()}
        wanted |= {k for w in watched.values() for k in w.keys}
        self._release([k for k in self.vinfo if k not in wanted], now)
        self._adopt(wanted, now)
        self.cells, self.watched, self.max_boosted = cells, watched, msg.max_boosted
        self.next_poll = min(w.due for w in watched.values()) if watched else None   # a new guest: due at once
        for cell in cells.values():              # boosts that must go, before their runtime does
            for m in cell.members:
                if not m.plan.priority or cell.boost_failed:
                    self._unboost_member(m)
        self._grant()
        for cell in cells.values():
            self._enter(cell, now, "fresh" if cell.deadline is None else "reapply")
        log.info("action=plan cells=%s watched=%s", ",".join(f"{c.id}:{len(c.members)}" for c in cells.values()) or "-",
                 ",".join(w.cell for w in watched.values()) or "-")

    def _adopt(self, keys, now: int) -> None:
        """vCPUs new to this switcher start from what their cgroup says: one
        left frozen (by a switcher that was killed) is known frozen, so its
        slot, its co-start or ``max_stall_ms`` thaws it."""
        for k in keys:
            if k in self.vstate:
                continue
            st = self.vstate[k] = VState()
            path = self.vinfo[k][1].freeze
            if path and (self.fs.read_or(path) or "").strip() == "1":
                st.frozen, st.frozen_since, st.credited = True, now, now
                log.info("domain=%s vcpu=%d action=adopted-frozen", self.vinfo[k][0], k[1])

    def _enter(self, cell: CellState, now: int, how: str) -> None:
        """Make the cell's actual state match its active member.

        ``how``: ``fresh`` (a new rotation starts now), ``switch`` (a slot
        boundary: counted and timed, the deadline advances by the slot) or
        ``reapply`` (a new plan kept this member active: deadline unchanged).
        """
        lone = len(cell.members) < 2
        active = cell.members[cell.active]
        t0 = self.clock()
        if cell.mode == "freeze" and not lone:
            outgoing = [k for i, m in enumerate(cell.members) if i != cell.active for k in m.keys()]
            for k in outgoing:
                self._freeze(k, True, t0)
            files = [self.vinfo[k][1].freeze for k in outgoing if self.vstate[k].frozen]
            t_written = self.clock()
            late = set(self.freezer.wait(files, True, timeout=self._freeze_wait_s()))
            t_waited = self.clock()
            if t_waited - t0 > 5_000_000:
                log.warning("cell=%s action=slow-freeze write_ms=%.2f wait_ms=%.2f", cell.id,
                            (t_written - t0) / 1e6, (t_waited - t_written) / 1e6)
            if late:
                self._report_late(cell, late)
        else:
            for m in cell.members:
                for k in m.keys():
                    self._freeze(k, False, t0)
        for k in active.keys():
            self._freeze(k, False, self.clock())
        t1 = self.clock()
        for i, m in enumerate(cell.members):
            if i != cell.active or lone:
                self._unboost_member(m)
        if not lone:
            self._boost_member(cell, active)
        if cell.mode != "freeze":
            t1 = self.clock()
        slot_ns = int(active.plan.slot_ms * 1_000_000)
        if lone:
            cell.deadline = None
        elif how == "fresh":
            cell.deadline = now + slot_ns
        elif how == "switch":
            self.counters.latency_ns.append(t1 - t0)
            self.counters.switches[cell.id] = self.counters.switches.get(cell.id, 0) + 1
            cell.deadline += slot_ns

    def _freeze_wait_s(self) -> float:
        """How long a slot change waits for ``frozen 1``: 50 ms, or a quarter
        of ``max_stall_ms`` if that is shorter."""
        return min(FREEZE_WAIT_S, self.max_stall_ns / 4e9)

    def _report_late(self, cell: CellState, late: set[str]) -> None:
        """Name each guest with a vCPU cgroup not frozen in time. Its freeze
        stays requested: only a thread that is not running fails to trap
        (queued behind others for a CPU, measured at 50 ms and more when a
        busy host's guests are first put in a gang, or blocked in the
        kernel), and it traps as soon as it runs, out of turn or not. The
        guest's own slot, or ``max_stall_ms``, thaws it as any other."""
        for i, m in enumerate(cell.members):
            stuck = [str(k[1]) for k in m.keys() if self.vinfo[k][1].freeze in late]
            if i != cell.active and stuck:
                self._error(f"domain={m.plan.name} vcpu={','.join(stuck)} not frozen within "
                            f"{self._freeze_wait_s() * 1000:g} ms: it freezes when it next runs")

    def tick(self) -> int | None:
        """Perform every due slot change; return the next deadline (or None)."""
        now = self.clock()
        for cell in self.cells.values():
            if cell.deadline is not None and now >= cell.deadline:
                self.counters.lateness_ns.append(now - cell.deadline)
                cell.active = (cell.active + 1) % len(cell.members)
                if now - cell.deadline > self.max_stall_ns:
                    cell.deadline = now              # hopelessly late: restart the cycle
                self._enter(cell, now, "switch")
        for key, st in self.vstate.items():
            if st.frozen and now - st.frozen_since > self.max_stall_ns:
                if key not in self.gone:           # one that exited frozen (its guest ended) held nothing up
                    self.counters.forced_thaws += 1
                    self._error(f"domain={self.vinfo[key][0]} vcpu={key[1]} frozen over max_stall: force-thawed")
                self._freeze(key, False, now)
        if self.next_poll is not None and now >= self.next_poll:
            self.poll(now)
            self.next_poll = min(w.due for w in self.watched.values())   # from now: no catch-up burst when late
        self._check_admission(now)
        deadlines = [c.deadline for c in self.cells.values() if c.deadline is not None] + (
            [self.next_poll] if self.next_poll is not None else [])
        return min(deadlines) if deadlines else None

    def _check_admission(self, now: int) -> None:
        """Check the deadline admission total when due, with no boost held
        and nothing released pending (the module doc), and recount it if
        it is wrong."""
        released = self.sched.released_by()
        quiet = not self.sched.holding() and now >= released
        if self.settling is None:
            every = REFUSED_CHECK_NS if self._refused and quiet else ADMISSION_CHECK_NS
            if not ((self._refused or released > self._checked) and now >= self._last_check + every):
                return
            self.settling = now                      # no boost starts meanwhile (poll)
        if not quiet and now - self.settling < SETTLE_MAX_NS:
            return
        # releases still pending after SETTLE_MAX_NS are left to the next check
        self._refused, self._checked, self._last_check, self.settling = False, min(released, now), now, None
        problem = self.admission.repair()
        self.admission_wrong = problem is not None
        if problem:
            self._error(problem)

    def release_all(self) -> None:
        now = self.clock()
        for w in self.watched.values():
            self._unwatch(w, now)
        self._release(list(self.vinfo), now)
        self.rt.release_all()
        self._watch_exits([])
        self.freezer.close()
        self.admission.close()
        self.cells, self.watched, self.next_poll = {}, {}, None

    def take_stats(self, released: bool = False) -> pr.Stats:
        """The counters since the last call; vCPUs frozen now are credited up to now."""
        now = self.clock()
        for key, st in self.vstate.items():
            if st.frozen:
                self.counters.add(self.counters.costop_ns, key, max(now - st.credited, 0))
                st.credited = now
        c, self.counters = self.counters, Counters()
        if c.held["refused"]:
            log.info("action=boosts-refused count=%d reason='deadline admission control (EBUSY)'", c.held["refused"])
        vcpus = sorted(set(c.costop_ns) | set(c.costops) | set(c.boosts))
        failed = {cell.id: cell.boost_failed for cell in self.cells.values() if cell.boost_failed}
        failed.update({w.cell: w.boost_failed for w in self.watched.values() if w.boost_failed})
        return pr.Stats(
            switches=c.switches, latency_ns=tuple(c.latency_ns), lateness_ns=tuple(c.lateness_ns),
            tallies=tuple(pr.Tally(uuid, vcpu, c.costop_ns.get((uuid, vcpu), 0), c.costops.get((uuid, vcpu), 0),
                                   c.boosts.get((uuid, vcpu), 0)) for uuid, vcpu in vcpus),
            forced_thaws=c.forced_thaws, long_waits_held=dict(c.held), long_waits_reported=c.reported,
            errors=tuple(c.errors),
            active={cell.id: cell.members[cell.active].uuid for cell in self.cells.values() if cell.members},
            boost_failed=failed, released=released, released_by=self.sched.released_by(),
            rt_stranded_us=self._stranded(), admission_wrong=self.admission_wrong)

    def _stranded(self) -> int:
        """RT runtime stranded in removed cgroups since the last call."""
        n, self._stranded_told = self.rt.stranded_us - self._stranded_told, self.rt.stranded_us
        return n


def serve(sw: Switcher, rfd: int, write: Callable[[str], None], realtime: bool,
          stopping: list | None = None) -> None:
    """The switch loop: read plans from ``rfd``, keep slots on time, report.

    ``write`` sends one encoded line to the daemon. Returns when ``rfd``
    closes (the daemon is gone), on ``Stop``, or once ``stopping`` is
    non-empty; everything is released before it returns.
    """
    stopping = stopping if stopping is not None else []
    told = [sw.long_waits.fileno()] if sw.long_waits is not None else []
    write(pr.encode(pr.Ready(realtime)))
    buf = b""
    next_stats = time.monotonic_ns() + STATS_EVERY_NS
    deadline = None
    try:
        while not stopping:
            now = time.monotonic_ns()
            wake = min(d for d in (deadline, next_stats) if d is not None)
            try:
                ready, _, _ = select.select([rfd, *sw.exits, *told], [], [], max(wake - now, 0) / 1e9)
            except InterruptedError:
                continue
            for fd in ready:
                if fd in told:
                    sw.told(time.monotonic_ns())
                elif fd != rfd:
                    sw.exited(fd)
            if rfd in ready:
                chunk = os.read(rfd, 1 << 20)
                if not chunk:
                    break                              # the daemon is gone
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    try:
                        msg = pr.decode(line)
                    except ValueError as e:
                        sw._error(str(e))
                        continue
                    if isinstance(msg, pr.Stop):
                        stopping.append(1)
                    elif isinstance(msg, pr.Plan):
                        if not realtime:               # boosts need the switcher above them
                            msg = _without_boosts(msg)
                        sw.apply(msg)
                        write(pr.encode(pr.Applied(msg.seq)))
                        next_stats = min(next_stats, time.monotonic_ns() + STATS_EVERY_NS)
            deadline = sw.tick()
            if time.monotonic_ns() >= next_stats:
                write(pr.encode(sw.take_stats()))
                next_stats += STATS_EVERY_NS if sw.cells or sw.watched else IDLE_STATS_EVERY_NS
    except BrokenPipeError:
        pass
    finally:
        sw.release_all()
        try:
            write(pr.encode(sw.take_stats(released=True)))
        except (BrokenPipeError, ValueError, OSError):
            pass
        log.info("action=released")


def _without_boosts(msg: pr.Plan) -> pr.Plan:
    from dataclasses import replace
    return replace(msg, cells=tuple(replace(c, members=tuple(replace(m, priority=0, boost_ms=0) for m in c.members))
                                    for c in msg.cells))


def main() -> int:
    """Entry point of the switcher process (see the module docstring)."""
    logs.setup(logging.INFO)
    priority = int(os.environ.get("COSCHED_SWITCHER_PRIORITY", "50"))
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
        realtime = True
    except OSError as e:
        realtime = False
        log.warning("action=no-realtime error=%r: boosts disabled, switching may be late", os.strerror(e.errno))
    try:
        long_waits = LongWaits.from_env(os.environ)
    except MeterUnavailable as e:
        long_waits = None
        log.warning("action=long-waits-off error=%r: long waits are found by looks", str(e))
    sw = Switcher(HostFS(os.environ.get("COSCHED_HOST_ROOT", "/")), max_stall_ns=500_000_000, long_waits=long_waits)
    stopping: list = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.append(1))

    def write(line: str) -> None:
        sys.stdout.write(line)
        sys.stdout.flush()

    serve(sw, sys.stdin.fileno(), write, realtime, stopping)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
