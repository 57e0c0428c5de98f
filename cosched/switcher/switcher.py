"""The switcher: the plan in force, turned into freeze/thaw and boosts on time.

It holds the rotation of each cell (:mod:`.rotation`), the watched guests
(:mod:`.watching`), the RT runtime boosts need (:mod:`.grants`) and the
per-vCPU state all of them change (:mod:`.vcpus`); it adopts each new plan,
performs what is due at each wake-up, checks the kernel's deadline admission
total, and counts what it did for the daemon.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from cosched.actuators.admission import RELEASE_WAIT_MAX_NS, Admission
from cosched.actuators.sched import SchedKnob
from cosched.hostfs import HostFS
from cosched.policy.plan import WATCHED
from cosched.policy.watch import BoostRules
from cosched.switcher import protocol as pr
from cosched.switcher.boosts import boost_share
from cosched.switcher.grants import Grants
from cosched.switcher.rotation import Rotation
from cosched.switcher.timing import ADMISSION_CHECK_NS, REFUSED_CHECK_NS
from cosched.switcher.vcpus import Vcpus
from cosched.switcher.watching import Watched, Watching

log = logging.getLogger("cosched.switcher")


class Switcher:
    """The slot tables of every cell, turned into freeze/thaw and boosts.

    ``sched`` applies scheduling attributes (a :class:`SchedKnob`, or one
    a test builds on fake system calls); ``clock`` gives monotonic ns;
    ``admission`` checks and recounts the kernel's deadline admission total
    (an :class:`Admission` through ``sched``'s system call by default);
    ``long_waits``: the meter's long-wait reports, or None.
    """

    def __init__(self, fs: HostFS, max_stall_ns: int, rt_top_us: int | None = None,
                 sched=None, clock: Callable[[], int] = time.monotonic_ns, admission: Admission | None = None,
                 long_waits=None):
        self.fs = fs
        self.max_stall_ns = max_stall_ns
        self.rt_top_us = rt_top_us
        self.sched = sched if sched is not None else SchedKnob(fs, clock=clock)
        self.clock = clock
        self.counters = pr.Stats()
        self._reported: set[str] = set()
        self.vcpus = Vcpus(fs, self.sched, clock, self.counters, self._error)
        self.rotation = Rotation(self.vcpus, self.counters, clock, self._error)
        self.rotation.max_stall_ns = max_stall_ns
        self.watching = Watching(fs, self.vcpus, self.counters, clock, self._error, boost_share(fs), long_waits)
        self.grants = Grants(fs, self.vcpus, self._error)
        self.max_boosted = 0
        self.admission = admission if admission is not None else Admission(fs, put=self.sched.set)
        self.admission_wrong: bool | None = None     # None: not checked yet
        self._checked = 0                            # releases up to here are covered by a check
        self._last_check = clock()                   # when the total was last checked (monotonic ns): the
                                                     # daemon checked it when it started (Engine.recover)
        self._refused = False                        # a boost was refused since the last check
        self.checking_since: int | None = None       # since when no boost starts: the total is checked then

    @property
    def long_waits(self):
        return self.watching.long_waits

    @property
    def busy(self) -> bool:
        """Whether it has anything to switch or watch."""
        return bool(self.rotation.cells or self.watching.watched)

    # -- errors never stop the loop --------------------------------------
    def _error(self, message: str) -> None:
        if message not in self._reported:
            self._reported.add(message)
            self.counters.error(message)
            log.warning("action=error %s", message)

    # -- plans ----------------------------------------------------------
    def apply(self, msg: pr.Orders) -> None:
        """Adopt a new plan, keeping each cell's rotation where it can."""
        now = self.clock()
        self.max_stall_ns = self.rotation.max_stall_ns = int(msg.max_stall_ms * 1_000_000)
        self.rt_top_us = msg.rt_top_us
        returns = {r.tid: r for r in msg.returns}
        cells = self.rotation.planned([c for c in msg.cells if c.mode not in WATCHED], returns)
        watched = self.watching.planned([c for c in msg.cells if c.mode in WATCHED], returns, now)
        wanted = {k for c in cells.values() for m in c.members for k in m.keys()}
        wanted |= {k for w in watched.values() for k in w.keys}
        self.grants.rt.release(self.vcpus.release([k for k in self.vcpus.info if k not in wanted], now))
        self.vcpus.adopt(wanted, now)
        self.max_boosted = msg.max_boosted
        self.watching.start(watched)
        self.rotation.start(cells)
        self._grant()
        self.rotation.enter_all(now)
        log.info("action=plan cells=%s watched=%s", ",".join(f"{c.id}:{len(c.members)}" for c in cells.values()) or "-",
                 ",".join(w.cell for w in watched.values()) or "-")

    def _grant(self) -> None:
        """Hold the RT runtime every boosted member needs (RT group
        scheduling only); a member refused its grant boosts no more with
        what needs it."""
        owners = self.rotation.rt_owners() + self.watching.rt_owners()
        for who, cid, path in self.grants.hold(owners, self.rt_top_us):
            if isinstance(who, Watched) and isinstance(who.rules, BoostRules):
                self.watching.fifo_off(who, f"RT runtime grant {path} failed")
            elif not who.boost_failed:
                who.boost_failed = f"RT runtime grant {path} failed; {cid} runs " + (
                    "without boosts" if isinstance(who, Watched) else "freeze-only")
                self._error(who.boost_failed)

    def exited(self, fd: int) -> None:
        """A vCPU holding RT runtime exited: its guest gives its runtime back now."""
        key = self.grants.exited(fd)
        if key is None:
            return
        self.watching.unboost_guest(key[0])          # no RT thread may stay in a group losing its runtime
        log.info("domain=%s vcpu=%d action=exited rt=given-back", self.vcpus.info.get(key, (key[0],))[0], key[1])
        self._grant()

    def take_reports(self, now: int) -> None:
        """Take the meter's reports of long waits: each one's guest is looked at now."""
        self.watching.take_reports(now)

    # -- time -------------------------------------------------------------
    def tick(self) -> int | None:
        """Perform every due slot change, look, and check; return the next deadline (or None)."""
        now = self.clock()
        self.rotation.tick(now)
        self.vcpus.thaw_stalled(now, self.max_stall_ns)
        watching = self.watching
        if watching.next_poll is not None and now >= watching.next_poll:
            room = 0 if self.checking_since is not None else self.max_boosted - watching.boosted()
            self._refused |= watching.poll(now, room, checking=self.checking_since is not None)
            watching.after_poll()
        self._check_admission(now)
        deadlines = self.rotation.deadlines() + ([watching.next_poll] if watching.next_poll is not None else [])
        return min(deadlines) if deadlines else None

    def _check_admission(self, now: int) -> None:
        """Check the deadline admission total when due, with no boost held
        and nothing released pending (``docs/design/admission.md``), and
        recount it if it is wrong. No boost starts while it waits for that
        (``checking_since``)."""
        released = self.sched.released_by()
        quiet = not self.sched.holding() and now >= released
        if self.checking_since is None:
            every = REFUSED_CHECK_NS if self._refused and quiet else ADMISSION_CHECK_NS
            if not ((self._refused or released > self._checked) and now >= self._last_check + every):
                return
            self.checking_since = now                      # no boost starts meanwhile (poll)
        if not quiet and now - self.checking_since < RELEASE_WAIT_MAX_NS:
            return
        # releases still pending after RELEASE_WAIT_MAX_NS are left to the next check
        self._refused, self._checked, self._last_check, self.checking_since = False, min(released, now), now, None
        problem = self.admission.repair()
        self.admission_wrong = problem is not None
        if problem:
            self._error(problem)

    # -- the end, and reports ---------------------------------------------
    def release_all(self) -> None:
        now = self.clock()
        self.watching.stop(now)
        self.grants.rt.release(self.vcpus.release(list(self.vcpus.info), now))
        self.grants.release_all()
        self.vcpus.freezer.close()
        self.admission.close()
        self.rotation.cells = {}

    def take_stats(self, released: bool = False) -> pr.Stats:
        """What it did since the last call, and its state now; vCPUs frozen
        now are credited up to now."""
        self.vcpus.credit(self.clock())
        c = self.counters.take()
        if c.long_waits_held.get("refused"):
            log.info("action=boosts-refused count=%d reason='deadline admission control (EBUSY)'",
                     c.long_waits_held["refused"])
        cells, watched = self.rotation.cells, self.watching.watched
        c.boost_failed = {cell.id: cell.boost_failed for cell in cells.values() if cell.boost_failed}
        c.boost_failed.update({w.cell: w.boost_failed for w in watched.values() if w.boost_failed})
        c.active = {cell.id: cell.running()[0].uuid for cell in cells.values() if cell.members}
        c.released, c.released_by = released, self.sched.released_by()
        c.rt_stranded_us, c.admission_wrong = self.grants.stranded(), self.admission_wrong
        return c
