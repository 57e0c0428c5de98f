"""The messages between the daemon's engine and the switcher process.

One JSON object per line, each with a ``type``; every message is a frozen
dataclass here and only :func:`encode` and :func:`decode` touch JSON, so both
ends agree by construction. Daemon to switcher: :class:`Orders`, :class:`Stop`.
Switcher to daemon: :class:`Ready` (it runs, realtime or not),
:class:`Applied` (a plan is in force), :class:`Stats` (every
:data:`STATS_EVERY_S`, every :data:`IDLE_STATS_EVERY_S` while it has nothing
to switch or watch, and a last one with ``released`` set when it has given
everything back). A busy switcher that falls silent is taken for stalled
(:func:`cosched.engine.supervisor.stall_limit`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields

from cosched.actuators.sched import SchedAttr
from cosched.policy.plan import Cell, Member, PlannedVcpu

STATS_EVERY_S = 0.1
IDLE_STATS_EVERY_S = 1.0       # idle: fewer wake-ups (10 a second cost 0.2% of a CPU)


@dataclass(frozen=True)
class VcpuReturn:
    """Where a vCPU thread goes back to from a boost: the attributes the
    journal recorded for it, and until when it takes no deadline boost
    (CLOCK_MONOTONIC ns; the daemon returned it from one: SchedKnob.quiet_until)."""

    tid: int
    original: SchedAttr = SchedAttr()
    quiet_until: int = 0


@dataclass(frozen=True)
class Orders:
    """The plan in force as the switcher takes it: the planner's cells
    (:class:`cosched.policy.plan.Cell`), as the engine hands them on, and
    each managed vCPU's return."""

    seq: int
    max_stall_ms: int
    rt_top_us: int | None
    cells: tuple[Cell, ...]
    max_boosted: int = 0                    # watched vCPUs boosted at once, at most
    returns: tuple[VcpuReturn, ...] = ()
    type: str = "orders"


@dataclass(frozen=True)
class Stop:
    type: str = "stop"


@dataclass(frozen=True)
class Ready:
    realtime: bool
    type: str = "ready"


@dataclass(frozen=True)
class Applied:
    seq: int
    type: str = "applied"


@dataclass(frozen=True)
class Tally:
    """One vCPU's cumulative counts since the switcher started."""

    uuid: str
    vcpu: int
    costop_ns: int = 0                      # time held frozen
    costops: int = 0                        # co-stops of this vCPU alone (relaxed)
    boosts: int = 0                         # boosts (boost, relaxed)


@dataclass(frozen=True)
class Stats:
    switches: dict[str, int] = field(default_factory=dict)      # cell -> slot changes since the last Stats
    latency_ns: tuple[int, ...] = ()
    lateness_ns: tuple[int, ...] = ()
    tallies: tuple[Tally, ...] = ()
    forced_thaws: int = 0
    long_waits_held: dict[str, int] = field(default_factory=dict)  # watched guests' long waits not boosted, by why
    long_waits_reported: int = 0            # long waits the meter reported (LongWaits)
    errors: tuple[str, ...] = ()
    active: dict[str, str] = field(default_factory=dict)        # cell -> uuid of the member in its slot
    boost_failed: dict[str, str] = field(default_factory=dict)  # cell -> why it runs freeze-only
    released: bool = False
    released_by: int = 0                    # CLOCK_MONOTONIC ns: its boosts' bandwidth all let go of (SchedKnob.released_by)
    rt_stranded_us: int = 0                 # RT runtime of grants whose cgroup was removed holding it, since the last Stats
    admission_wrong: bool | None = None     # the deadline admission total, at the last check: wrong and not recounted
    type: str = "stats"


MESSAGES = {cls.type: cls for cls in (Orders, Stop, Ready, Applied, Stats)}
_NESTED = {(Orders, "cells"): Cell, (Cell, "members"): Member, (Member, "vcpus"): PlannedVcpu,
           (Orders, "returns"): VcpuReturn, (Stats, "tallies"): Tally}


def encode(msg) -> str:
    """One line of JSON for a message: its dataclasses as objects of their
    fields (``vars``: what ``asdict`` gives, without its deep copies),
    tuples as arrays."""
    return json.dumps(msg, default=vars, separators=(",", ":")) + "\n"


def _build(cls, data: dict):
    kwargs = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        value = data[f.name]
        item = _NESTED.get((cls, f.name))
        if item is not None:
            value = tuple(_build(item, v) for v in value)
        elif f.name == "original":
            value = SchedAttr.from_json(value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[f.name] = value
    return cls(**kwargs)


def decode(line: str | bytes):
    """The message on one line; ValueError names what is wrong with it."""
    try:
        data = json.loads(line)
        cls = MESSAGES[data["type"]]
        return _build(cls, data)
    except (KeyError, TypeError) as e:
        raise ValueError(f"bad message {str(line)[:80]!r}: {type(e).__name__} {e}") from None
