"""Resolve: a snapshot and the planner's settings in, the one plan to run out.

The step between discovery and the engine. Every guest under ``auto`` is put
under its mode in force (:meth:`cosched.policy.auto.Auto.settle`, which asks
the planner again where it rejects a chosen mode); the plan of the snapshot
so settled is the plan the engine applies, computed once for each snapshot
the settling asks about. Pure, as the rest of the policy package.
"""
from __future__ import annotations

from dataclasses import dataclass

from cosched.model import Snapshot
from cosched.policy.auto import Auto
from cosched.policy.plan import Plan, PlanConfig, plan


@dataclass(frozen=True)
class Resolved:
    snapshot: Snapshot                           # each auto guest under its mode in force
    plan: Plan
    changes: tuple[tuple[str, str, str, str], ...]   # (name, old mode, new mode, why) of auto guests


def resolve(snap: Snapshot, cfg: PlanConfig, auto: Auto) -> Resolved:
    """The plan for ``snap``, with ``auto``'s guests settled into their modes."""
    last: list = []

    def planner(s: Snapshot) -> Plan:
        if not last or last[0] != s:
            last[:] = [s, plan(s, cfg)]
        return last[1]
    settled, changes = auto.settle(snap, planner)
    return Resolved(settled, planner(settled), tuple(changes))
