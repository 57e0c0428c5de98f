"""What the switcher did to each vCPU thread it was given, and the actions that change it.

A vCPU is keyed ``(uuid, index, tid, freeze path)``: a new thread or cgroup is
a new vCPU. Freezing and thawing count co-stop time; a boost is taken back to
exactly the attributes recorded for the thread, with the vCPU held still
through the return where it has a cgroup to freeze; nothing is forgotten
before it is thawed and returned.
"""
from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from typing import Callable

from cosched.actuators.freezer import Freezer
from cosched.actuators.journal import GONE
from cosched.actuators.sched import SchedAttr
from cosched.hostfs import HostFS
from cosched.policy.plan import Member, PlannedVcpu
from cosched.switcher import protocol as pr
from cosched.switcher.timing import STILL_WAIT_S

log = logging.getLogger("cosched.switcher")


def keys_of(plan: Member) -> tuple[tuple, ...]:
    """One key per vCPU thread and cgroup of a guest: a new TID or path is a new vCPU."""
    return tuple((plan.uuid, v.index, v.tid, v.freeze) for v in plan.vcpus)


@dataclass
class VState:
    """What the switcher did to one vCPU thread."""

    frozen: bool = False
    frozen_since: int = 0
    credited: int = 0            # co-stop time counted up to here
    boosted: bool = False


class Vcpus:
    """Every vCPU the switcher holds: its plan, what was done to it, and the
    per-vCPU actions. ``sched`` applies scheduling attributes; ``error``
    reports a problem once."""

    def __init__(self, fs: HostFS, sched, clock: Callable[[], int], counters: pr.Stats,
                 error: Callable[[str], None]):
        self.fs, self.sched, self.clock, self.counters, self.error = fs, sched, clock, counters, error
        self.freezer = Freezer(fs)
        self.state: dict[tuple, VState] = {}
        self.info: dict[tuple, tuple[str, PlannedVcpu]] = {}       # key -> (domain name, vCPU plan)
        self.original: dict[tuple, SchedAttr] = {}                   # key -> what a boost returns it to
        self.gone: set[tuple] = set()                                # vCPUs seen to exit

    def hold(self, name: str, plan: Member, returns: dict[int, pr.VcpuReturn]) -> tuple[tuple, ...]:
        """Know a guest's vCPUs by their keys (returned), and what each returns to from a boost."""
        keys = keys_of(plan)
        for v, k in zip(plan.vcpus, keys):
            self.info[k] = (name, v)
            self.original[k] = returns[v.tid].original if v.tid in returns else SchedAttr()
        return keys

    def frozen(self, key) -> bool:
        st = self.state.get(key)
        return st is not None and st.frozen

    def boosted(self, key) -> bool:
        st = self.state.get(key)
        return st is not None and st.boosted

    def freeze(self, key, frozen: bool, now: int) -> None:
        """Freeze or thaw one vCPU's cgroup; a thaw counts its co-stop time."""
        st = self.state.setdefault(key, VState())
        name, v = self.info[key]
        if st.frozen == frozen or not v.freeze:
            return
        try:
            self.freezer.set(v.freeze, frozen)
        except OSError as e:
            if e.errno not in GONE:
                self.error(f"domain={name} vcpu={v.index} freeze={frozen}: {os.strerror(e.errno)}")
            return
        if frozen:
            st.frozen, st.frozen_since, st.credited = True, now, now
        else:
            self.counters.count(self.counters.costop, key, max(now - st.credited, 0) / 1e9)
            st.frozen = False

    def unboost(self, key, siblings: tuple = ()) -> None:
        """Return a boosted thread to exactly the attributes recorded for it.
        ``siblings``: the keys of its guest's vCPUs where the guest is
        watched, none of which may stay frozen all at once (:meth:`_frozen_meanwhile`)."""
        st = self.state.get(key)
        if st is None or not st.boosted:
            return
        name, v = self.info[key]
        original = self.original[key]
        try:
            self.sched.apply(v.tid, original, still=(lambda: self._frozen_meanwhile(key, siblings)) if v.freeze else None)
        except OSError as e:
            if e.errno not in GONE:
                self.error(f"domain={name} vcpu={v.index} unboost to {original}: {os.strerror(e.errno)}")
                return
        st.boosted = False

    @contextlib.contextmanager
    def _frozen_meanwhile(self, key, siblings: tuple):
        """Keep a vCPU from running (its cgroup frozen, unless it is already)
        while its boost is taken back through the zero reservation: one
        that woke between the two calls ran at that reservation's rate and
        was held back by its next boosts (:mod:`cosched.actuators.sched`).
        A watched guest never has every vCPU frozen at once: when all its
        other vCPUs are co-stopped, one co-stop ends first."""
        name, v = self.info[key]
        if self.frozen(key):
            yield
            return
        others = [k for k in siblings if k != key]
        if others and all(self.frozen(k) for k in others):
            self.freeze(others[0], False, self.clock())

        def thaw_failed(e: OSError) -> None:
            if e.errno not in GONE:
                self.error(f"domain={name} vcpu={v.index} thaw after unboost: {os.strerror(e.errno)}")
        with self.freezer.still(v.freeze, STILL_WAIT_S, thaw_failed):
            yield

    def release(self, keys: list, now: int) -> list[str]:
        """Thaw these vCPUs, unboost them and forget them; the RT runtime
        files whose grants they no longer need (below the top) are returned."""
        for k in keys:
            self.freeze(k, False, now)
        for k in keys:
            self.unboost(k)
        chains = [p for k in keys for p in self.info[k][1].rt_chain[1:]]
        for k in keys:
            self.state.pop(k, None)
            self.original.pop(k, None)
            self.freezer.forget(self.info.pop(k)[1].freeze)
        return chains

    def adopt(self, keys, now: int) -> None:
        """vCPUs new to this switcher start from what their cgroup says: one
        left frozen (by a switcher that was killed) is known frozen, so its
        slot, its co-start or ``max_stall_ms`` thaws it."""
        for k in keys:
            if k in self.state:
                continue
            st = self.state[k] = VState()
            path = self.info[k][1].freeze
            if path and (self.fs.read_or(path) or "").strip() == "1":
                st.frozen, st.frozen_since, st.credited = True, now, now
                log.info("domain=%s vcpu=%d action=adopted-frozen", self.info[k][0], k[1])

    def thaw_stalled(self, now: int, max_stall_ns: int) -> None:
        """Thaw every vCPU frozen longer than ``max_stall_ns``, whatever froze it."""
        for key, st in self.state.items():
            if st.frozen and now - st.frozen_since > max_stall_ns:
                if key not in self.gone:           # one that exited frozen (its guest ended) held nothing up
                    self.counters.forced_thaws += 1
                    self.error(f"domain={self.info[key][0]} vcpu={key[1]} frozen over max_stall: force-thawed")
                self.freeze(key, False, now)

    def credit(self, now: int) -> None:
        """Count the co-stop time of the vCPUs frozen now, up to now."""
        for key, st in self.state.items():
            if st.frozen:
                self.counters.count(self.counters.costop, key, max(now - st.credited, 0) / 1e9)
                st.credited = now
