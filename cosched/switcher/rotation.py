"""The rotation: each cell's slot table turned into freeze and thaw on time.

In a cell of two or more turns (:attr:`~cosched.policy.plan.Cell.turns`:
one member each, or the hosted members together) the vCPUs of one turn run
while the others' are frozen (``freeze`` cells), and a member with a
priority is boosted with SCHED_FIFO for its slot. At each slot boundary the
next turn takes over; a new plan keeps the turn that was running where it can.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable

from cosched.actuators.journal import GONE
from cosched.actuators.sched import SchedAttr
from cosched.policy.plan import Cell, Member
from cosched.switcher import protocol as pr
from cosched.switcher.timing import FREEZE_WAIT_S
from cosched.switcher.vcpus import Vcpus, VState, keys_of

log = logging.getLogger("cosched.switcher")


@dataclass
class MemberState:
    plan: Member

    @property
    def uuid(self) -> str:
        return self.plan.uuid

    def keys(self) -> tuple[tuple, ...]:
        return keys_of(self.plan)


@dataclass
class CellState:
    id: str
    mode: str
    members: list[MemberState]
    turns: tuple[tuple[int, ...], ...] = ()     # indices into members, in turn (Cell.turns)
    active: int = 0                             # the turn running now
    deadline: int | None = None
    boost_failed: str | None = None

    def running(self) -> list[MemberState]:
        """The members of the turn running now."""
        return [self.members[i] for i in self.turns[self.active]] if self.turns else []

    def slot_ns(self) -> int:
        return int(self.members[self.turns[self.active][0]].plan.slot_ms * 1_000_000)


class Rotation:
    """The rotated cells of the plan in force (``cells``)."""

    def __init__(self, vcpus: Vcpus, counters: pr.Stats, clock: Callable[[], int], error: Callable[[str], None]):
        self.vcpus, self.counters, self.clock, self.error = vcpus, counters, clock, error
        self.cells: dict[str, CellState] = {}
        self.max_stall_ns = 0

    def planned(self, plans: list[Cell], returns: dict[int, pr.VcpuReturn]) -> dict[str, CellState]:
        """The cells of a new plan, each keeping the turn that runs now where
        a member of it still has a turn (and its slot's deadline)."""
        cells: dict[str, CellState] = {}
        for c in plans:
            members = [MemberState(m) for m in c.members]
            cell = CellState(c.id, c.mode, members, c.turns)
            prev = self.cells.get(c.id)
            if prev is not None and prev.members:
                running = {m.uuid for m in prev.running()}
                kept = [t for t, turn in enumerate(cell.turns) if running & {members[i].uuid for i in turn}]
                if kept:
                    cell.active, cell.deadline = kept[0], prev.deadline
                cell.boost_failed = prev.boost_failed
            cells[c.id] = cell
            for m in members:
                self.vcpus.hold(m.plan.name, m.plan, returns)
        return cells

    def start(self, cells: dict[str, CellState]) -> None:
        """Put ``cells`` in force, taking back the boosts that must go
        (before their RT runtime does); :meth:`enter_all` then runs each
        cell's active member."""
        self.cells = cells
        for cell in cells.values():
            for m in cell.members:
                if not m.plan.priority or cell.boost_failed:
                    self._unboost_member(m)

    def enter_all(self, now: int) -> None:
        for cell in self.cells.values():
            self._enter(cell, now, "fresh" if cell.deadline is None else "reapply")

    def keys(self) -> set[tuple]:
        return {k for c in self.cells.values() for m in c.members for k in m.keys()}

    def rt_owners(self) -> list[tuple[CellState, Member, str, tuple]]:
        """The members boosted in their slots: (cell, plan, cell id, keys)."""
        return [(cell, m.plan, cell.id, m.keys()) for cell in self.cells.values() for m in cell.members
                if m.plan.priority]

    def tick(self, now: int) -> None:
        """Perform every due slot change."""
        for cell in self.cells.values():
            if cell.deadline is not None and now >= cell.deadline:
                self.counters.lateness_ns.append(now - cell.deadline)
                cell.active = (cell.active + 1) % len(cell.turns)
                if now - cell.deadline > self.max_stall_ns:
                    cell.deadline = now              # hopelessly late: restart the cycle
                self._enter(cell, now, "switch")

    def deadlines(self) -> list[int]:
        return [c.deadline for c in self.cells.values() if c.deadline is not None]

    def _boost_member(self, cell: CellState, m: MemberState) -> None:
        if not m.plan.priority or cell.boost_failed or any(k in self.vcpus.gone for k in m.keys()):
            return
        try:
            for k in m.keys():
                if not self.vcpus.state.setdefault(k, VState()).boosted:
                    self.vcpus.sched.apply(k[2], SchedAttr("fifo", priority=m.plan.priority))
                    self.vcpus.state[k].boosted = True
        except OSError as e:
            if e.errno in GONE:
                return
            cell.boost_failed = (f"boost impossible for domain {m.plan.name}: {os.strerror(e.errno)}; "
                                 f"cell {cell.id} runs freeze-only")
            self.error(cell.boost_failed)
            self._unboost_member(m)

    def _unboost_member(self, m: MemberState) -> None:
        for k in m.keys():
            self.vcpus.unboost(k)

    def _enter(self, cell: CellState, now: int, how: str) -> None:
        """Make the cell's actual state match its running turn.

        ``how``: ``fresh`` (a new rotation starts now), ``switch`` (a slot
        boundary: counted and timed, the deadline advances by the slot) or
        ``reapply`` (a new plan kept this turn running: deadline unchanged).
        """
        lone = len(cell.turns) < 2
        turn = set(cell.turns[cell.active])
        running = cell.running()
        vcpus = self.vcpus
        t0 = self.clock()
        if cell.mode == "freeze" and not lone:
            outgoing = [k for i, m in enumerate(cell.members) if i not in turn for k in m.keys()]
            for k in outgoing:
                vcpus.freeze(k, True, t0)
            files = [vcpus.info[k][1].freeze for k in outgoing if vcpus.state[k].frozen]
            t_written = self.clock()
            late = set(vcpus.freezer.wait(files, True, timeout=self.freeze_wait_s()))
            t_waited = self.clock()
            if t_waited - t0 > 5_000_000:
                log.warning("cell=%s action=slow-freeze write_ms=%.2f wait_ms=%.2f", cell.id,
                            (t_written - t0) / 1e6, (t_waited - t_written) / 1e6)
            if late:
                self._report_late(cell, late)
        else:
            for m in cell.members:
                for k in m.keys():
                    vcpus.freeze(k, False, t0)
        for m in running:
            for k in m.keys():
                vcpus.freeze(k, False, self.clock())
        t1 = self.clock()
        for i, m in enumerate(cell.members):
            if i not in turn or lone:
                self._unboost_member(m)
        if not lone:
            for m in running:
                self._boost_member(cell, m)
        if cell.mode != "freeze":
            t1 = self.clock()
        slot_ns = cell.slot_ns()
        if lone:
            cell.deadline = None
        elif how == "fresh":
            cell.deadline = now + slot_ns
        elif how == "switch":
            self.counters.latency_ns.append(t1 - t0)
            self.counters.switches[cell.id] = self.counters.switches.get(cell.id, 0) + 1
            cell.deadline += slot_ns

    def freeze_wait_s(self) -> float:
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
        turn = set(cell.turns[cell.active])
        for i, m in enumerate(cell.members):
            stuck = [str(k[1]) for k in m.keys() if self.vcpus.info[k][1].freeze in late]
            if i not in turn and stuck:
                self.error(f"domain={m.plan.name} vcpu={','.join(stuck)} not frozen within "
                           f"{self.freeze_wait_s() * 1000:g} ms: it freezes when it next runs")
