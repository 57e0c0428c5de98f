"""The watched guests (``boost`` and ``relaxed``): looks at their vCPUs, and the rules' answers carried out.

Each watched guest is looked at through descriptors of its vCPU threads'
``/proc`` files, as often as its rules ask (:mod:`cosched.policy.watch`):
``BoostRules`` boosts a vCPU kept waiting while a sibling runs, ``RelaxedRules`` also
co-stops the vCPU that ran ahead. With the in-kernel meter, the long waits of
a ``boost`` guest are reported as they turn long, and the guest is looked at
then, and until the boosts they led to are over: it is not polled otherwise.
"""
from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass, field
from typing import Callable

from cosched.actuators.journal import GONE
from cosched.hostfs import OUT_OF_FILES, HostFS
from cosched.kernel import on_cpu, parse_schedstat, stat_runnable_cpu
from cosched.policy.plan import Cell, Member
from cosched.policy.watch import BoostRules, Look, RelaxedRules, on_cpu_unchanged
from cosched.switcher import protocol as pr
from cosched.switcher.boosts import FALLBACK_BOOST, boost_attr, fifo_budget_ns, fresh_ns
from cosched.switcher.timing import LONG_WAIT_NS, WATCH_POLL_NS
from cosched.switcher.vcpus import Vcpus, VState, keys_of

log = logging.getLogger("cosched.switcher")


@dataclass
class Watched:
    """One watched guest: its rules, and descriptors of its vCPU threads."""

    cell: str
    plan: Member
    rules: object                            # policy.watch.BoostRules or RelaxedRules
    fds: list[tuple[int, int, int] | None]   # (stat, schedstat, status) per vCPU
    keys: tuple[tuple, ...]                  # per vCPU, as vcpus.keys_of (computed once: polled 2,000 times a second)
    boost_failed: str | None = None
    refused: dict[int, int] = field(default_factory=dict)    # vCPU index -> errno of its refused SCHED_DEADLINE
                                                             # boost (EPERM: pinned to a subset); it takes the
                                                             # SCHED_FIFO fallback at once while this plan (its
                                                             # pinning) holds (BoostRules.fifo_only)
    seen: list[Look | None] = field(default_factory=list)    # the last look's
    due: int | None = 0                                      # when its next look is (monotonic ns; None: at a report)
    long: set[int] = field(default_factory=set)              # vCPUs reported in a long wait since the last look
    subscribed: bool = False                                 # the meter reports its long waits (Watching._subscribe)
    back: tuple = ()                                         # its vCPUs' returns (VcpuReturn or None) it was given


class Watching:
    """The watched guests of the plan in force (``watched``, by uuid).
    ``share``: of a CPU, per deadline boost; ``long_waits``: the meter's
    long-wait reports (:class:`cosched.sampler.meter.LongWaits`), or None."""

    def __init__(self, fs: HostFS, vcpus: Vcpus, counters: pr.Stats, clock: Callable[[], int],
                 error: Callable[[str], None], share: float, long_waits=None):
        self.fs, self.vcpus, self.counters, self.clock, self.error = fs, vcpus, counters, clock, error
        self.share = share
        self.long_waits = long_waits
        if long_waits is not None:
            long_waits.set_after(LONG_WAIT_NS)
        self._subscribed: dict[int, tuple[str, int]] = {}  # reported thread -> (uuid of its watch, vCPU index)
        self.watched: dict[str, Watched] = {}
        self.next_poll: int | None = None
        self._turn = 0                               # which watched guest a poll serves first

    def planned(self, plans: list[Cell], returns: dict[int, pr.VcpuReturn], now: int) -> dict[str, Watched]:
        """The watches of a new plan: one whose guest, plan, cell and vCPU
        returns are unchanged goes on; every other watch ends, and new ones begin."""
        watched: dict[str, Watched] = {}
        for c in plans:
            for m in c.members:
                prev = self.watched.pop(m.uuid, None)
                back = tuple(returns.get(v.tid) for v in m.vcpus)
                if prev is not None and (prev.plan, prev.cell, prev.back) == (m, c.id, back):
                    watched[m.uuid] = prev
                    continue
                if prev is not None:
                    self._unwatch(prev, now)
                watched[m.uuid] = self._watch(c, m, returns)
                watched[m.uuid].back = back
                self.vcpus.hold(m.name, m, returns)
        for w in self.watched.values():
            self._unwatch(w, now)
        return watched

    def start(self, watched: dict[str, Watched]) -> None:
        """Put ``watched`` in force; a new guest is due a look at once."""
        self.watched = watched
        self.after_poll()

    def stop(self, now: int) -> None:
        for w in self.watched.values():
            self._unwatch(w, now)
        self.watched, self.next_poll = {}, None

    def keys(self) -> set[tuple]:
        return {k for w in self.watched.values() for k in w.keys}

    def boosted(self) -> int:
        """How many watched vCPUs hold a boost now."""
        return sum(1 for w in self.watched.values() for k in w.keys if self.vcpus.boosted(k))

    def rt_owners(self) -> list[tuple[Watched, Member, str, tuple]]:
        """The watched guests that boost: (watch, plan, cell id, keys)."""
        return [(w, w.plan, w.cell, w.keys) for w in self.watched.values() if w.plan.boost_ms]

    def fifo_off(self, w: Watched, why: str) -> None:
        """A ``boost`` guest that cannot have SCHED_FIFO boosts: from now on
        it boosts a vCPU only when a deadline boost is allowed (said once)."""
        if w.rules.fifo:
            w.rules.fifo = False
            self.error(f"domain={w.plan.name}: {why}; {w.cell} boosts with SCHED_DEADLINE only, "
                       "a vCPU again once its last boost's period is over")

    def unboost_guest(self, uuid: str) -> None:
        """Take back every boost of one guest's vCPUs, watched or not."""
        w = self.watched.get(uuid)
        for k in [k for k in self.vcpus.info if k[0] == uuid]:
            self.vcpus.unboost(k, w.keys if w is not None else ())

    def _watch(self, cell: Cell, m: Member, returns: dict[int, pr.VcpuReturn]) -> Watched:
        n = len(m.vcpus)
        sched = self.vcpus.sched
        if cell.mode == "relaxed":
            rules = RelaxedRules(n, int(m.costop_ms * 1e6), int(m.costart_ms * 1e6), int(m.boost_ms * 1e6),
                            int(m.pause_ms * 1e6), fresh_ns(m.boost_ms, self.share), WATCH_POLL_NS)
        else:
            rules = BoostRules(n, int(m.boost_ms * 1e6), int(m.pause_ms * 1e6), fresh_ns(m.boost_ms, self.share), fifo=True,
                        fifo_budget_ns=fifo_budget_ns(m))
        for i, v in enumerate(m.vcpus):      # returned from a deadline boost lately, here or by the daemon
            planned = returns[v.tid].quiet_until if v.tid in returns else 0
            rules.hold(i, max(planned, sched.quiet_until(v.tid)))
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
                    self.error(f"domain={m.name} vcpu={v.index}: {e.strerror}: the guest is not watched")
        w = Watched(cell.id, m, rules, fds, keys_of(m))
        self._subscribe(w)
        log.info("domain=%s action=watch mode=%s looks=%s", m.name, cell.mode, "reported" if w.subscribed else "polled")
        return w

    def _subscribe(self, w: Watched) -> None:
        """Have the meter report the long waits of a ``boost`` guest, which
        is then looked at only when its rules need it (``BoostRules.reported``);
        where the meter cannot, it is polled."""
        if self.long_waits is None or not isinstance(w.rules, BoostRules):
            return
        m = w.plan
        try:
            for v in m.vcpus:
                self.long_waits.watch(v.tid)
                self._subscribed[v.tid] = (m.uuid, v.index)
        except OSError as e:
            for v in m.vcpus:
                self._unsubscribe(v.tid)
            self.error(f"domain={m.name}: {e}; its long waits are found by looks alone")
            return
        w.rules.reported = w.subscribed = True

    def _unsubscribe(self, tid: int) -> None:
        if self._subscribed.pop(tid, None) is not None:
            self.long_waits.unwatch(tid)

    def take_reports(self, now: int) -> None:
        """Take the meter's reports of long waits: each one's guest is looked at now."""
        for tid in self.long_waits.take():
            uuid, i = self._subscribed.get(tid, (None, None))    # an entry lives as long as its watch
            w = self.watched.get(uuid)
            if w is not None:
                self.counters.long_waits_reported += 1
                w.long.add(i)
                w.due = now
                self.next_poll = now

    def _unwatch(self, w: Watched, now: int) -> None:
        """Stop watching: thaw and unboost its vCPUs, close its descriptors."""
        for v in w.plan.vcpus:
            self._unsubscribe(v.tid)
        for k in w.keys:
            if k in self.vcpus.info:
                self.vcpus.freeze(k, False, now)
                self.vcpus.unboost(k, w.keys)
        for v in w.plan.vcpus:
            self.vcpus.sched.forget(v.tid)
        for fds in w.fds:
            for fd in fds or ():
                os.close(fd)
        w.fds = []

    @staticmethod
    def _see(fds: tuple[int, int, int] | None, before: Look | None) -> Look | None:
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
            return Look(runnable, cpu, run, switch_ins, on)
        except (OSError, ValueError):
            return None

    def _boost(self, w: Watched, i: int, fifo: bool) -> bool | None:
        """Boost vCPU ``i`` of ``w``: SCHED_DEADLINE, or SCHED_FIFO where its
        rules ask (``fifo``) or SCHED_DEADLINE was refused. Whether it holds
        a boost now; None when the kernel's deadline admission refused it."""
        key = w.keys[i]
        vcpus, sched = self.vcpus, self.vcpus.sched
        st = vcpus.state.setdefault(key, VState())
        if st.boosted:
            return True
        tid = w.plan.vcpus[i].tid
        if i not in w.refused and not fifo:
            try:
                sched.apply(tid, boost_attr(w.plan.boost_ms, self.share))
                w.rules.started(i, self.clock())   # the boost began before this
                stale = not sched.fresh(tid)
            except OSError as e:
                if e.errno in GONE:
                    return False
                if e.errno == errno.EBUSY:
                    # deadline admission control is full for now (other deadline tasks, or an
                    # old boost's bandwidth not yet released), or its total is wrong: skip this one,
                    # not the guest, and have the total checked (a boost refused adds nothing to release)
                    self.counters.hold("refused")
                    return None
                w.refused[i] = e.errno
                if isinstance(w.rules, BoostRules):
                    w.rules.fifo_only(i)          # its boosts count against its RT runtime budget
        if i in w.refused or fifo:
            try:
                sched.apply(tid, FALLBACK_BOOST)     # e.g. pinned to a subset: no SCHED_DEADLINE
            except OSError as e:
                if e.errno in GONE:
                    return False
                if i in w.refused:
                    w.boost_failed = (f"boost impossible for domain {w.plan.name}: {os.strerror(w.refused[i])} for "
                                      f"SCHED_DEADLINE, {os.strerror(e.errno)} for SCHED_FIFO; "
                                      f"{w.cell} runs without boosts")
                    self.error(w.boost_failed)
                else:
                    self.fifo_off(w, f"{os.strerror(e.errno)} for SCHED_FIFO")
                return False
            stale = False
        st.boosted = True
        if stale:
            vcpus.unboost(key, w.keys)      # it would not run while boosted: back now, held as the knob says
            w.rules.hold(i, sched.quiet_until(tid))
            self.counters.hold("stale")
            return st.boosted
        self.counters.count(self.counters.boosts, key)
        return True

    def poll(self, now: int, room: int, checking: bool) -> bool:
        """One look at every watched vCPU due one, and the rules' answer
        carried out, with ``room`` for that many more boosts (none while
        ``checking`` the admission total). Whether the kernel refused a boost."""
        vcpus, sched = self.vcpus, self.vcpus.sched
        refused = False
        order = list(self.watched.values())          # each poll another guest first: the room is shared
        self._turn = (self._turn + 1) % len(order) if order else 0
        for w in order[self._turn:] + order[:self._turn]:
            if w.due is None or w.due > now + WATCH_POLL_NS // 4:   # not due (those due about now share this wake-up)
                continue
            rules = w.rules
            seen = [self._see(fds, before) for fds, before in zip(w.fds, w.seen or [None] * len(w.fds))]
            w.seen = seen
            if not seen or any(s is None for s in seen):
                w.due = now + (rules.next_in or 1) * WATCH_POLL_NS    # gone: looked at until discovery says so
                continue
            keys = w.keys
            if isinstance(rules, RelaxedRules):      # a forced thaw ends a co-stop too
                for v, k in zip(rules.vcpus, keys):
                    v.frozen = vcpus.frozen(k)
            if w.long:                          # reported: only boost guests' are (BoostRules)
                acts = rules.step(now, seen, 0 if w.boost_failed else max(room, 0), long=w.long)
                w.long = set()
            else:
                acts = rules.step(now, seen, 0 if w.boost_failed else max(room, 0))
            w.due = None if rules.next_in is None else now + rules.next_in * WATCH_POLL_NS
            if not w.boost_failed:
                held = dict(acts.held)
                if checking and "room" in held:    # no room: the admission total is checked
                    held["check"] = held.pop("room")
                for why, n in held.items():
                    self.counters.hold(why, n)
            for i in acts.unboost:
                vcpus.unboost(keys[i], keys)
                rules.hold(i, sched.quiet_until(w.plan.vcpus[i].tid))
                room += 1
            for i in acts.thaw:
                vcpus.freeze(keys[i], False, now)
            for i in acts.freeze:
                vcpus.freeze(keys[i], True, now)
                if vcpus.frozen(keys[i]):
                    self.counters.count(self.counters.costops, keys[i])
            # In the rules' order, also where a deadline boost of a vCPU queued on the switcher's own CPU
            # preempts it (SCHED_DEADLINE is above its SCHED_FIFO) and so delays the boosts after it:
            # applying those last served barrier and pingpong guests worse and cost more CPU (the
            # switcher, no longer held off, looked more often; docs/decisions/0011-fifo-boosts-within-a-deadline-period.md).
            for i in acts.boost:
                done = self._boost(w, i, i in acts.fifo)
                if done:
                    room -= 1
                else:
                    refused |= done is None
                    rules.cancel(i)
        return refused

    def after_poll(self) -> None:
        """The next look is the earliest due, from now: no catch-up burst when
        late; None while every guest waits for a report."""
        self.next_poll = min((w.due for w in self.watched.values() if w.due is not None), default=None)
