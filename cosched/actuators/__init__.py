"""Actuators: one small module per knob cosched turns on the host.

``freezer`` (cgroup v2 ``cgroup.freeze`` of the per-vCPU cgroups), ``sched``
(scheduling attributes: boosts), ``rt_runtime`` (on kernels with RT group
scheduling, the ``cpu.rt_runtime_us`` grants FIFO boosts need),
``affinity`` (vCPU pinning: ``sched_setaffinity`` of the vCPU threads) and
``placement`` (per-vCPU cgroups for guests that have none, as
Proxmox VE's). Every knob keeps one contract (:class:`~cosched.actuators.journal.Knob`):
given a vCPU (a :class:`~cosched.actuators.journal.Target`) it records the
originals of what it may change, which the engine journals before its first
write; it restores an entry, verifies that the host holds the original
again, and tells whether the entry's target still ``exists``. ``cosched reset``
and the daemon's exit replay the journal through them. :func:`knobs` is the
one list of them: a new knob is a module here and an entry in that list.
``admission`` changes nothing that lasts: it checks the kernel's deadline
admission total and has the kernel recount it when boosts left it wrong.
"""
from __future__ import annotations


def knobs(fs, sched=None, affinity=None) -> dict:
    """Every knob, by the journal ``kind`` it restores; ``sched`` and
    ``affinity`` default to the real system calls (tests pass fakes)."""
    from cosched.actuators.affinity import AffinityKnob
    from cosched.actuators.freezer import FreezerKnob
    from cosched.actuators.placement import PlacementKnob
    from cosched.actuators.rt_runtime import RtRuntimeKnob
    from cosched.actuators.sched import SchedKnob

    found = (sched or SchedKnob(fs), FreezerKnob(fs), RtRuntimeKnob(fs), affinity or AffinityKnob(fs),
             PlacementKnob(fs))
    return {k.kind: k for k in found}
