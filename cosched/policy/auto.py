"""``auto``: choose each guest's mode from what the sampler measures. Pure code.

Every :data:`DECIDE_S` the daemon hands :class:`Chooser` one :class:`Evidence`
per guest under ``auto``: what its vCPUs did in that window (the sampler's
run and wait, the engine's co-stop time, the hazard estimate). Two signals,
each smoothed over about :data:`TAU_S` seconds, decide:

``contention``
    ``(wait + costop) / (run + wait + costop)``: of the time its vCPUs wanted
    a CPU, the share they did not get one, whether the host scheduler or
    cosched held them back. It does not depend on the mode in force: gang
    turns waiting into co-stop, it does not make the demand go away.
``idleness``
    ``idle / (vCPU time not co-stopped)``: how much its vCPUs block or halt
    when they could run. A co-stopped vCPU is not idle, so this does not
    depend on the mode either.

A contended guest whose vCPUs never idle (spin barriers, spin locks, LU,
busy independent threads) gets ``gang`` or ``partial`` (``partial`` where
the pool has room for more than one such guest at a time): measured on the
2-CPU development host, the best or within a few percent of it for every
such workload, 3-40x the host scheduler on the synchronising ones. A
contended guest whose vCPUs idle gets ``relaxed``: within a few percent of
the best on a sleeping workload (where ``gang`` loses half to three
quarters) and close to ``gang`` on a pipe ping-pong, whose vCPUs idle while
they wait for each other (where ``boost`` kept 12-16% of the ideal against
``relaxed``'s 67-87%). ``boost`` scores just below ``relaxed``: it is what
``auto`` picks for idle guests when ``allow`` rules ``relaxed`` out. An
uncontended guest needs nothing: ``none``. Scores in 0..1, with
``c = min(contention / CONTENDED, 1)``, ``idle = ramp(idleness, 0.05, 0.20)``
(0 up to 5% idle, 1 from 20%)::

    none     1 - c
    gang     c x (1 - idle)       partial the same (see above)
    relaxed  c x (0.5 + 0.5 idle)
    boost    0.8 x relaxed

so gang wins below 10% idleness and relaxed above; where ``allow`` rules
out gang and partial, a busy guest still gets relaxed (barrier guests:
20-30% of the ideal against the host scheduler's 2%).

Hysteresis: a guest leaves its mode only for one that scores at least
:data:`MARGIN` higher, on the smoothed signals and on the latest window
alike, in :data:`CONFIRM` decisions in a row, and never sooner than
``dwell-s`` after its last change. Since neither signal moves
when the mode changes, a steady guest settles; a guest that changes phase
is followed within ``dwell-s`` plus about two smoothing times.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from math import exp

from cosched.policy.params import resolve

DECIDE_S = 1.0
TAU_S = 1.0
CONTENDED = 0.15
MARGIN = 0.15
CONFIRM = 2
LADDER = ("none", "boost", "relaxed", "gang", "partial")


@dataclass(frozen=True)
class Evidence:
    """One guest over one decision window; times in seconds (vCPU-seconds for
    ``run``, ``wait`` and ``costop``)."""

    seconds: float
    vcpus: int
    run: float
    wait: float
    costop: float = 0.0
    hazard: float = 0.0

    @property
    def idle(self) -> float:
        return max(self.seconds * self.vcpus - self.run - self.wait - self.costop, 0.0)

    @property
    def contention(self) -> float:
        wanted = self.run + self.wait + self.costop
        return (self.wait + self.costop) / wanted if wanted > 0 else 0.0

    @property
    def idleness(self) -> float:
        free = self.seconds * self.vcpus - self.costop
        return min(self.idle / free, 1.0) if free > 0 else 0.0


BOOST_OF_RELAXED = 0.8


def _ramp(x: float, lo: float, hi: float) -> float:
    return min(max((x - lo) / (hi - lo), 0.0), 1.0)


def scores(contention: float, idleness: float, coschedule: str = "gang") -> dict[str, float]:
    """Each mode's score for these (smoothed) signals; ``coschedule`` names
    the strict mode that fits the host (gang or partial), the other gets 0.9 of it."""
    c = min(contention / CONTENDED, 1.0)
    idle = _ramp(idleness, 0.05, 0.20)
    loose = 0.5 + 0.5 * idle
    out = {"none": 1.0 - c, "relaxed": c * loose, "boost": c * loose * BOOST_OF_RELAXED,
           "gang": c * (1.0 - idle), "partial": c * (1.0 - idle)}
    out["partial" if coschedule == "gang" else "gang"] *= 0.9
    return out


@dataclass
class Choice:
    """One guest's state under auto, and the last decision's reasons."""

    mode: str = "none"
    since: float = 0.0                    # when the mode last changed
    contention: float | None = None       # smoothed signals
    idleness: float | None = None
    hazard: float | None = None
    pending: str | None = None            # a better mode, and for how many decisions
    pending_n: int = 0
    scores: dict[str, float] = field(default_factory=dict)
    last: Evidence | None = None
    reason: str = "no evidence yet"


class Chooser:
    """The modes of all guests under auto. ``decide`` is called every window."""

    def __init__(self):
        self.guests: dict[str, Choice] = {}

    def forget(self, keep: set[str]) -> None:
        for uuid in [u for u in self.guests if u not in keep]:
            del self.guests[uuid]

    def decide(self, uuid: str, now: float, ev: Evidence, allow: tuple[str, ...], dwell_s: float,
               coschedule: str = "gang") -> tuple[str, str | None]:
        """Take one window's evidence; return (mode, why it changed or None)."""
        ch = self.guests.setdefault(uuid, Choice(since=float("-inf")))     # the first choice need not dwell
        if ev.seconds <= 0:
            return ch.mode, None
        a = 1.0 - exp(-ev.seconds / TAU_S)
        for name, value in (("contention", ev.contention), ("idleness", ev.idleness),
                            ("hazard", ev.hazard / ev.seconds)):
            old = getattr(ch, name)
            setattr(ch, name, value if old is None else old + a * (value - old))
        ch.last = ev
        ch.scores = scores(ch.contention, ch.idleness, coschedule)
        allowed = [m for m in LADDER if m in allow] or ["none"]
        if ch.mode not in allowed:                         # the bounds changed: obey at once
            best = max(allowed, key=lambda m: ch.scores[m])
            return self._change(ch, best, now, f"{ch.mode} is no longer allowed")
        best = max(allowed, key=lambda m: ch.scores[m])
        gain = ch.scores[best] - ch.scores[ch.mode]
        raw = scores(ev.contention, ev.idleness, coschedule)
        if best != ch.mode and best != max(allowed, key=lambda m: raw[m]):
            # on the way between two rungs the smoothed signals pass the ones
            # between: move only where the latest window points as well
            ch.pending, ch.pending_n = None, 0
            ch.reason = f"{best} scores best on average, but not in the last window: {ch.mode} kept"
            return ch.mode, None
        if best == ch.mode or gain < MARGIN:
            ch.pending, ch.pending_n = None, 0
            ch.reason = f"{ch.mode} is best" if best == ch.mode else (
                f"{best} scores only {gain:.2f} more than {ch.mode} (needs {MARGIN})")
            return ch.mode, None
        ch.pending_n = ch.pending_n + 1 if ch.pending == best else 1
        ch.pending = best
        if ch.pending_n < CONFIRM:
            ch.reason = f"{best} better by {gain:.2f}: confirming ({ch.pending_n}/{CONFIRM})"
            return ch.mode, None
        if now - ch.since < dwell_s:
            ch.reason = f"{best} better by {gain:.2f}, but {ch.mode} has held only {now - ch.since:.0f} s of {dwell_s:g}"
            return ch.mode, None
        return self._change(ch, best, now, f"{best} scores {ch.scores[best]:.2f} against {ch.scores[ch.mode]:.2f} "
                                            f"(contention {ch.contention:.2f}, idleness {ch.idleness:.2f})")

    @staticmethod
    def _change(ch: Choice, mode: str, now: float, why: str) -> tuple[str, str]:
        ch.mode, ch.since, ch.pending, ch.pending_n, ch.reason = mode, now, None, 0, why
        return mode, why

    def explain(self, uuid: str) -> dict | None:
        """The evidence, scores and decision for one guest (``cosched explain``)."""
        ch = self.guests.get(uuid)
        if ch is None:
            return None
        last = ch.last
        return {
            "mode": ch.mode,
            "since": ch.since,
            "reason": ch.reason,
            "pending": ch.pending,
            "signals": {"contention": ch.contention, "idleness": ch.idleness, "hazard_per_second": ch.hazard},
            "last_window": None if last is None else {
                "seconds": last.seconds, "vcpus": last.vcpus, "run": last.run, "wait": last.wait,
                "costop": last.costop, "idle": last.idle, "hazard": last.hazard},
            "scores": dict(ch.scores),
        }


class Auto:
    """Every guest under ``auto`` on a host: evidence in, modes out. Pure.

    :meth:`step` turns the sampler's cumulative figures (``views``, by uuid)
    and the engine's co-stop seconds (by (uuid, vCPU)) into one window of
    :class:`Evidence` per guest and lets the chooser decide; :meth:`effective`
    gives the snapshot the planner sees, each auto guest under its mode.
    """

    def __init__(self):
        self.chooser = Chooser()
        self._totals: dict[str, tuple[float, float, float, float, float]] = {}

    def step(self, now: float, snap, views, costop, pool_cpus: int) -> list[tuple[str, str, str, str]]:
        """One decision for every auto guest; the changes as (name, old, new, why)."""
        changes = []
        auto = [d for d in snap.domains if d.policy is not None and d.policy.kind == "auto"] if snap else []
        keep = {d.uuid for d in auto}
        self.chooser.forget(keep)
        self._totals = {u: t for u, t in self._totals.items() if u in keep}
        for d in auto:
            v = views.get(d.uuid)
            if v is None or not v.vcpus:
                continue
            totals = (v.observed, sum(x.run for x in v.vcpus), sum(x.wait for x in v.vcpus),
                      sum(costop.get((d.uuid, x.index), 0.0) for x in v.vcpus), v.hazard)
            before, self._totals[d.uuid] = self._totals.get(d.uuid), totals
            if before is None:
                continue
            seconds, run, wait, held, hazard = (max(a - b, 0.0) for a, b in zip(totals, before))
            params = dict(d.policy.params)
            old = self.mode(d.uuid)
            coschedule = "partial" if pool_cpus >= 2 * len(d.vcpus) else "gang"
            mode, why = self.chooser.decide(d.uuid, now, Evidence(seconds, len(v.vcpus), run, wait, held, hazard),
                                            params["allow"], params["dwell-s"], coschedule)
            if why is not None:
                changes.append((d.name, old, mode, why))
        return changes

    def mode(self, uuid: str) -> str:
        ch = self.chooser.guests.get(uuid)
        return ch.mode if ch else "none"

    def effective(self, snap):
        """``snap`` with each auto guest's policy replaced by its current mode."""
        if snap is None:
            return snap
        domains = tuple(
            replace(d, policy=replace(d.policy, kind=self.mode(d.uuid), params=resolve(self.mode(d.uuid), {}, {})))
            if d.policy is not None and d.policy.kind == "auto" else d for d in snap.domains)
        return replace(snap, domains=domains)
