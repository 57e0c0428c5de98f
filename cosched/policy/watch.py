"""The per-guest rules of ``boost`` and ``relaxed``: pure state machines.

The switcher looks at watched vCPU threads (every 0.5 ms; a ``boost`` guest
without long waits less often, or, where the meter reports its long waits,
only when one is reported and until it is answered, see :class:`BoostRules`)
and feeds what it saw to one :class:`BoostRules` or :class:`RelaxedRules`
per guest; they answer which vCPUs to boost, unboost, co-stop (freeze) and
co-start (thaw). No I/O here, so the rules are tested on synthetic streams.

How it works, with the measurements behind it: ``docs/design/watch.md``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

HELD = ("room", "pause", "runtime", "refused", "stale", "check")   # why a long wait was not boosted (status's
                                                                   # long_waits_held; check: the switcher's)
CALM_LOOKS = 16      # looks without a long wait before a boost guest is looked at half as often
SLOWEST = 16         # at most every 16th poll (8 ms)
FIFO_WINDOW_NS = 1_000_000_000   # RT runtime is granted per period (cpu.rt_period_us: 1 s unless changed)


@dataclass(frozen=True)
class Look:
    """One vCPU thread at one poll."""

    runnable: bool               # state R: running or queued
    cpu: int | None              # host CPU of its run queue
    run_ns: int                  # cumulative run time
    picks: int                   # cumulative switch-ins
    on_cpu: bool                 # running right now


def on_cpu_unchanged(before: Look | None, runnable: bool, run_ns: int, picks: int) -> bool | None:
    """Whether a thread is on a CPU, where its last poll (``before``) and
    this one's counters tell without its switch-outs; None where they do
    not. A switch-in counts in ``picks``, and a switch-out brings run time up
    to date: with neither, a thread on a CPU then is on it still, and one
    queued or just woken is still queued. A thread that is not runnable is
    on no CPU."""
    if not runnable:
        return False
    if before is None or (run_ns, picks) != (before.run_ns, before.picks):
        return None
    return before.on_cpu and before.runnable


@dataclass
class Actions:
    """What to do to a guest's vCPUs, by index, in this order."""

    boost: list[int] = field(default_factory=list)
    fifo: list[int] = field(default_factory=list)        # of those, to boost with SCHED_FIFO: not yet
                                                         # a deadline boost (:class:`BoostRules`, ``fifo``)
    unboost: list[int] = field(default_factory=list)
    freeze: list[int] = field(default_factory=list)
    thaw: list[int] = field(default_factory=list)
    held: dict[str, int] = field(default_factory=dict)   # long waits newly held back, by why: room, pause


@dataclass
class _Vcpu:
    boosted_at: int | None = None
    boost_picks: int = 0
    quiet_until: int = 0             # no boost before (pause-ms)
    deadline_after: int = 0          # no deadline boost before (its last one's period; the kernel's hold)
    fifo: bool = False               # its boost is SCHED_FIFO
    fifo_only: bool = False          # every boost SCHED_FIFO: refused SCHED_DEADLINE (BoostRules.fifo_only)
    fifo_spent: list = field(default_factory=list)   # (end, ns) of its SCHED_FIFO boosts in the last window
    progress: int = 0
    run_ns: int | None = None        # its run time at the last look
    frozen: bool = False
    awake: bool = False              # runnable at the last look (relaxed)
    wait_picks: int | None = None    # its switch-ins when the last look found it waiting
    held: int | None = None          # its switch-ins when a long wait of it was last held back


def _waiting(vcpus: list[_Vcpu], seen: list[Look]) -> list[bool]:
    """Per vCPU, whether it waits: runnable, not on a CPU, not co-stopped."""
    return [s.runnable and not s.on_cpu and not v.frozen for v, s in zip(vcpus, seen)]


class BoostRules:
    """Boost co-scheduling of one guest with ``n`` vCPUs (see the module doc).

    ``period_ns``: no deadline boost of a vCPU sooner after its last one
    began, nor before :meth:`hold`'s time. With ``fifo``, a long wait of a
    vCPU that may not take a deadline boost yet is boosted with SCHED_FIFO
    instead (:attr:`Actions.fifo`), which no period binds; without, it is
    held, and every boost counts as a deadline boost. ``fifo_budget_ns``
    (None: no limit) bounds the time a vCPU spends in SCHED_FIFO boosts
    over any :data:`FIFO_WINDOW_NS`, from their start to their end as the
    looks saw them (at least the time it ran in them): the RT runtime
    granted to its cgroup, past which the kernel throttles it, and a
    throttled vCPU boosted with SCHED_FIFO does not run at all.

    Where its long waits are reported (:attr:`reported`, set by the
    switcher once the meter reports them), the guest is looked at only while
    it needs looks: while a vCPU holds a boost (to end it) or a long wait is
    still unanswered (held back, or no sibling ran at its look), every poll;
    otherwise at the next report (``next_in`` None).
    """

    def __init__(self, n: int, boost_ns: int, pause_ns: int, period_ns: int = 0, fifo: bool = False,
                 fifo_budget_ns: int | None = None):
        self.boost_ns = boost_ns
        self.pause_ns = pause_ns
        self.period_ns = period_ns
        self.fifo = fifo
        self.fifo_budget_ns = fifo_budget_ns
        self.vcpus = [_Vcpu() for _ in range(n)]
        self.every = 1           # look at this guest every that many polls
        self.next_in: int | None = 1   # polls until the next look (None: at the next report)
        self._calm = 0           # looks since the last long wait, at this pace
        self.reported = False    # its long waits are reported (step's ``long``): looked at only when needed

    def _long_waits(self, seen: list[Look], reported=()) -> tuple[list[bool], list[bool], list[bool]]:
        """Per vCPU: whether it waits; whether it waited at the last look
        too, not switched in since (a long wait the looks found); and
        whether it is in a long wait, found by the looks or ``reported``."""
        waiting = _waiting(self.vcpus, seen)
        looked = [w and v.wait_picks == s.picks for w, v, s in zip(waiting, self.vcpus, seen)]
        long = [found or (w and i in reported) for i, (w, found) in enumerate(zip(waiting, looked))]
        for w, v, s in zip(waiting, self.vcpus, seen):
            v.wait_picks = s.picks if w else None
        return waiting, looked, long

    def _pace(self, waiting: list[bool], long: list[bool], running: list[int]) -> None:
        if self.reported:
            return                            # step sets next_in once it knows its boosts
        if any(long):
            self.every, self._calm = 1, 0
        else:
            self._calm += 1
            if self._calm >= CALM_LOOKS:
                self.every, self._calm = min(2 * self.every, SLOWEST), 0
        self.next_in = 1 if running and any(waiting) else self.every

    @property
    def boosted(self) -> list[int]:
        return [i for i, v in enumerate(self.vcpus) if v.boosted_at is not None]

    def cancel(self, i: int) -> None:
        """The boost of vCPU ``i`` could not be applied: it is not boosted."""
        self.vcpus[i].boosted_at = None

    def started(self, i: int, at: int) -> None:
        """The boost of vCPU ``i`` took effect by ``at`` (a deadline boost's
        period is counted from then)."""
        if self.vcpus[i].boosted_at is not None:
            self.vcpus[i].boosted_at = at

    def hold(self, i: int, until: int) -> None:
        """No deadline boost of vCPU ``i`` before ``until``: the kernel may
        hold a deadline that far away for it, which a boost would inherit
        (:meth:`cosched.actuators.sched.SchedKnob.quiet_until`)."""
        self.vcpus[i].deadline_after = max(self.vcpus[i].deadline_after, until)

    def fifo_only(self, i: int) -> None:
        """vCPU ``i`` cannot take a deadline boost (the kernel refuses
        SCHED_DEADLINE to a thread pinned to a subset of CPUs): each of its
        boosts, the one just started too, is SCHED_FIFO, bound by no period
        and counted against ``fifo_budget_ns``."""
        self.vcpus[i].fifo_only = self.vcpus[i].fifo = True

    def _fifo_now(self, v: _Vcpu, now: int) -> bool:
        """Whether a boost of vCPU ``v`` now would be SCHED_FIFO."""
        return v.fifo_only or (self.fifo and now < v.deadline_after)

    def _why_not(self, v: _Vcpu, now: int) -> str | None:
        """Why vCPU ``v`` may not be boosted now (one of :data:`HELD`), or None."""
        if now < v.quiet_until or (now < v.deadline_after and not self.fifo):
            return "pause"
        if self._fifo_now(v, now) and self.fifo_budget_ns is not None:
            v.fifo_spent = [(t, ns) for t, ns in v.fifo_spent if t > now - FIFO_WINDOW_NS]
            if sum(ns for _, ns in v.fifo_spent) + self.boost_ns > self.fifo_budget_ns:
                return "runtime"
        return None

    def _ends(self, now: int, seen: list[Look], out: Actions) -> None:
        for i, (v, s) in enumerate(zip(self.vcpus, seen)):
            if v.boosted_at is not None and (s.picks > v.boost_picks or not s.runnable
                                             or now - v.boosted_at >= self.boost_ns):
                v.quiet_until = now + max(self.pause_ns, 1)     # 0: from the next look
                if v.fifo:
                    if self.fifo_budget_ns is not None:     # counted only against a budget
                        v.fifo_spent.append((now, now - v.boosted_at))
                else:                   # not before the kernel let go of this boost's budget
                    v.deadline_after = max(v.deadline_after, v.boosted_at + self.period_ns)
                v.boosted_at = None
                out.unboost.append(i)

    def _held(self, i: int, seen: list[Look], out: Actions, why: str) -> None:
        """Count a long wait held back, once per wait (under the first reason)."""
        v = self.vcpus[i]
        if v.held != seen[i].picks:
            v.held = seen[i].picks
            out.held[why] = out.held.get(why, 0) + 1

    def _start(self, i: int, now: int, seen: list[Look], out: Actions) -> None:
        v = self.vcpus[i]
        v.boosted_at, v.boost_picks = now, seen[i].picks
        v.fifo = self._fifo_now(v, now)
        out.boost.append(i)
        if v.fifo:
            out.fifo.append(i)

    def step(self, now: int, seen: list[Look], room: int, waited=None, trigger=None, long=()) -> Actions:
        """React to one poll; boost at most ``room`` vCPUs.

        ``long``: the vCPUs reported in a long wait since the last look
        (:class:`cosched.sampler.meter.LongWaits`); a long wait is also one
        seen at two looks in a row. ``waited``/``trigger`` let
        :class:`RelaxedRules` reuse the rules for its laggards (looked at every
        poll); by default a running sibling triggers boosts of long waits,
        and the look sets the pace.
        """
        out = Actions()
        self._ends(now, seen, out)
        running = [j for j, s in enumerate(seen) if s.on_cpu]
        if waited is None:
            # a reported long wait is found without looks: it leaves the pace as it is
            waiting, looked, waited = self._long_waits(seen, long)
            self._pace(waiting, looked, running)
        if running if trigger is None else trigger:
            full = False
            for i, s in enumerate(seen):
                v = self.vcpus[i]
                if not waited[i] or v.boosted_at is not None:
                    continue
                stacked = [j for j in running if seen[j].cpu == s.cpu and s.cpu is not None
                           and self.vcpus[j].boosted_at is None]
                why = next(filter(None, (self._why_not(self.vcpus[j], now) for j in [i, *stacked[:1]])), None)
                if why:
                    self._held(i, seen, out, why)         # it, or the runner it needs boosted first
                    continue
                if full or room < 1 + len(stacked[:1]):
                    full = True                       # the room goes in order: the later ones wait too
                    self._held(i, seen, out, "room")
                    continue
                for j in stacked[:1]:                 # the runner first: the second boost pushes one away
                    self._start(j, now, seen, out)
                    room -= 1
                self._start(i, now, seen, out)
                room -= 1
            if out.boost and trigger is None:        # hold the runners' CPUs while the others start
                for j in running:
                    v = self.vcpus[j]
                    if room > 0 and v.boosted_at is None and not self._why_not(v, now):
                        self._start(j, now, seen, out)
                        room -= 1
        if self.reported and trigger is None:
            # a boost to end, or a long wait still unanswered: the next poll; else the next report
            unanswered = any(w and v.boosted_at is None for w, v in zip(waited, self.vcpus))
            self.next_in = 1 if self.boosted or unanswered else None
        return out


class RelaxedRules:
    """Relaxed co-scheduling of one guest (see the module doc)."""

    def __init__(self, n: int, costop_ns: int, costart_ns: int, boost_ns: int = 0, pause_ns: int = 0,
                 period_ns: int = 0, poll_ns: int = 0):
        self.costop_ns = costop_ns
        self.costart_ns = costart_ns
        self.poll_ns = poll_ns   # the poll's interval (0: look at every poll)
        self.next_in = 1         # polls until the next look
        self.vcpus = [_Vcpu() for _ in range(n)]
        self.boost_rules = BoostRules(n, boost_ns, pause_ns, period_ns) if boost_ns else None
        self._at: int | None = None

    def cancel(self, i: int) -> None:
        if self.boost_rules is not None:
            self.boost_rules.cancel(i)

    def started(self, i: int, at: int) -> None:
        if self.boost_rules is not None:
            self.boost_rules.started(i, at)

    def hold(self, i: int, until: int) -> None:
        if self.boost_rules is not None:
            self.boost_rules.hold(i, until)

    @property
    def frozen(self) -> list[int]:
        return [i for i, v in enumerate(self.vcpus) if v.frozen]

    def leads(self, seen: list[Look]) -> list[int]:
        """Each vCPU's lead over its slowest runnable, unfrozen sibling (0 without one)."""
        out = []
        for i, v in enumerate(self.vcpus):
            behind = [w.progress for j, w in enumerate(self.vcpus) if j != i and seen[j].runnable and not w.frozen]
            out.append(max(v.progress - min(behind), 0) if behind else 0)
        return out

    def step(self, now: int, seen: list[Look], room: int = 0) -> Actions:
        dt = now - self._at if self._at is not None else 0
        self._at = now
        waited = _waiting(self.vcpus, seen)
        for v, s, w in zip(self.vcpus, seen, waited):
            ran = s.run_ns - v.run_ns if v.run_ns is not None else 0
            v.run_ns = s.run_ns
            if not v.frozen:
                v.progress += min(ran, dt) if w else dt
        front = max(v.progress for v in self.vcpus)
        for v, s in zip(self.vcpus, seen):
            if not v.frozen and not (s.runnable and v.awake):
                v.progress = front                    # blocked now or at the last look: it owes nothing
            v.awake = s.runnable
        out = Actions()
        leads = self.leads(seen)
        for i, v in enumerate(self.vcpus):
            if v.frozen and leads[i] <= self.costart_ns:
                v.frozen = False
                out.thaw.append(i)
        for i in sorted(range(len(leads)), key=lambda i: -leads[i]):
            v = self.vcpus[i]
            running = [j for j, w in enumerate(self.vcpus) if not w.frozen and j != i]
            if not v.frozen and leads[i] > self.costop_ns and running:
                v.frozen = True
                out.freeze.append(i)
        if self.boost_rules is not None:
            # boost only laggards, and only while a sibling is held for them
            got = self.boost_rules.step(now, seen, room, waited=waited, trigger=bool(self.frozen))
            out.boost, out.unboost, out.held = got.boost, got.unboost, got.held
        if self.frozen or (self.boost_rules is not None and self.boost_rules.boosted) or not self.poll_ns:
            self.next_in = 1
        else:
            self.next_in = max(1, min(SLOWEST, (self.costop_ns - max(leads)) // (2 * self.poll_ns)))
        return out
