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

import copy
import json
from dataclasses import dataclass, field, fields

from cosched.actuators.sched import SchedAttr
from cosched.histogram import Histogram
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


LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.002, 0.005, 0.01, 0.05)
LATENESS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1)
ERRORS_KEPT = 50


@dataclass
class Stats:
    """What the switcher did: the one record of it, from the switcher to
    metrics. The switcher counts into one over the time since it last
    reported and sends it (:meth:`take`); the engine adds each it receives
    to one of its own, counting since the daemon started (:meth:`add`), so
    a restarted switcher resets nothing; metrics, status, ``auto`` and the
    sampler read that one. Counts are of the time covered; ``active`` to
    ``admission_wrong`` are the state at its end; the last two fields are
    the engine's own."""

    switches: dict[str, int] = field(default_factory=dict)        # cell -> slot changes
    latency_ns: list[int] = field(default_factory=list)   # each slot change: first freeze write to last thaw
    lateness_ns: list[int] = field(default_factory=list)  # each slot change: how late after its deadline
    latency: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))    # s: the samples add() took
    lateness: Histogram = field(default_factory=lambda: Histogram(LATENESS_BUCKETS))
    costop: dict[tuple[str, int], float] = field(default_factory=dict)   # (uuid, vCPU) -> seconds held frozen
    costops: dict[tuple[str, int], int] = field(default_factory=dict)    # co-stops of this vCPU alone (relaxed)
    boosts: dict[tuple[str, int], int] = field(default_factory=dict)     # boosts (boost, relaxed)
    forced_thaws: int = 0
    long_waits_held: dict[str, int] = field(default_factory=dict)        # watched guests' long waits not boosted, by why
    long_waits_reported: int = 0                                         # long waits the meter reported (LongWaits)
    errors: list[str] = field(default_factory=list)                      # problems reported (the last ERRORS_KEPT)
    error_count: int = 0                                                 # all of them
    rt_stranded_us: int = 0              # RT runtime of grants whose cgroup was removed holding it
    active: dict[str, str] = field(default_factory=dict)          # cell -> uuid of the first member of the running turn
    boost_failed: dict[str, str] = field(default_factory=dict)    # cell -> why it runs freeze-only
    released: bool = False
    released_by: int = 0                 # CLOCK_MONOTONIC ns: its boosts' bandwidth all let go of (SchedKnob.released_by)
    admission_wrong: bool | None = None  # the deadline admission total, at the last check: wrong and not recounted
    realtime: bool | None = None         # the engine's: whether the switcher runs realtime
    journal_damage: int = 0              # the engine's: lines of the journal found damaged at start
    type: str = "stats"

    @staticmethod
    def count(per_vcpu: dict, key: tuple, n: float = 1) -> None:
        """Count ``n`` for the vCPU a switcher key names (its uuid and index)."""
        per_vcpu[key[:2]] = per_vcpu.get(key[:2], 0) + n

    def hold(self, why: str, n: int = 1) -> None:
        """Count ``n`` long waits of watched guests not boosted, for ``why``."""
        self.long_waits_held[why] = self.long_waits_held.get(why, 0) + n

    def error(self, message: str) -> None:
        self.errors.append(message)
        del self.errors[:-ERRORS_KEPT]
        self.error_count += 1

    def take(self) -> "Stats":
        """The counts so far; this record starts again from nothing."""
        taken = copy.copy(self)
        self.__init__()
        return taken

    def add(self, d: "Stats") -> None:
        """Add the counts of ``d``, a later stretch of time, and take its state."""
        for mine, theirs in ((self.switches, d.switches), (self.costop, d.costop), (self.costops, d.costops),
                             (self.boosts, d.boosts), (self.long_waits_held, d.long_waits_held)):
            for k, n in theirs.items():
                mine[k] = mine.get(k, 0) + n
        for hist, samples in ((self.latency, d.latency_ns), (self.lateness, d.lateness_ns)):
            for ns in samples:
                hist.observe(ns / 1e9)
        self.forced_thaws += d.forced_thaws
        self.long_waits_reported += d.long_waits_reported
        self.rt_stranded_us += d.rt_stranded_us
        self.errors.extend(d.errors)
        del self.errors[:-ERRORS_KEPT]
        self.error_count += d.error_count
        self.active, self.boost_failed, self.released = dict(d.active), dict(d.boost_failed), d.released
        self.released_by = max(self.released_by, d.released_by)
        if d.admission_wrong is not None:
            self.admission_wrong = d.admission_wrong

    def to_json(self) -> dict:
        """Its fields as JSON takes them, per-vCPU counts as ``[uuid, vCPU,
        costop, costops, boosts]`` rows; without the histograms, which only
        the engine's record fills (a switcher sends its samples)."""
        out = {k: v for k, v in vars(self).items() if k not in ("costop", "costops", "boosts", "latency", "lateness")}
        out["vcpus"] = [[*k, self.costop.get(k, 0.0), self.costops.get(k, 0), self.boosts.get(k, 0)]
                        for k in sorted(set(self.costop) | set(self.costops) | set(self.boosts))]
        return out

    @classmethod
    def from_json(cls, data: dict) -> "Stats":
        s = cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data and f.name not in ("latency", "lateness")})
        for uuid, vcpu, *counts in data.get("vcpus", []):
            for per_vcpu, n in zip((s.costop, s.costops, s.boosts), counts, strict=True):
                if n:
                    per_vcpu[(uuid, vcpu)] = n
        return s


MESSAGES = {cls.type: cls for cls in (Orders, Stop, Ready, Applied, Stats)}
_NESTED = {(Orders, "cells"): Cell, (Cell, "members"): Member, (Member, "vcpus"): PlannedVcpu,
           (Orders, "returns"): VcpuReturn}


def encode(msg) -> str:
    """One line of JSON for a message: its dataclasses as objects of their
    fields (``vars``: what ``asdict`` gives, without its deep copies),
    tuples as arrays; :class:`Stats` as :meth:`Stats.to_json` gives it."""
    return json.dumps(msg.to_json() if isinstance(msg, Stats) else msg, default=vars, separators=(",", ":")) + "\n"


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
        return cls.from_json(data) if cls is Stats else _build(cls, data)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"bad message {str(line)[:80]!r}: {type(e).__name__} {e}") from None
