"""``auto``: choose each guest's mode from what the sampler measures. Pure code.

Every :data:`DECIDE_S` the daemon hands :class:`Chooser` one :class:`Evidence`
per guest under ``auto``: what its vCPUs did in that window (the sampler's
run and wait, the engine's co-stop time, the hazard estimate). Three signals,
each smoothed over about :data:`TAU_S` seconds, decide:

How it works, with the measurements behind it: ``docs/design/auto.md``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from math import exp

from cosched.policy.params import resolve
from cosched.policy.plan import HOSTED

DECIDE_S = 1.0
TAU_S = 1.0
CONTENDED = 0.15
MARGIN = 0.15
CONFIRM = 2
IDLENESS = (0.45, 0.70)     # ramps from "idles like a hand-off" to "mostly sleeps"
SPREAD = (0.30, 0.60)
SPINNING = (20.0, 200.0)  # KVM: directed-yield attempts per second of vCPU run time, "a little" to "spins"
HALTING = (0.10, 0.25)    # KVM: idleness that says the vCPUs wait for each other by halting (a hand-off)
HOSTED_IDLENESS = IDLENESS[1]   # a busy none guest idling less than this is hosted beside a gang
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
    spread: float = 0.0     # most idle vCPU's idleness less the busiest's
    busy: float | None = None   # vCPUs' worth of work: the sum of each vCPU's 1 - idleness
    spins: float | None = None  # KVM's directed-yield attempts per second of vCPU run time (None: no KVM counters)
    halts: float | None = None  # KVM's halt exits per second of vCPU run time

    @staticmethod
    def of_vcpus(seconds: float, vcpus: list[tuple[float, float, float]], hazard: float = 0.0) -> "Evidence":
        """A window from each vCPU's (run, wait, costop) in it."""
        each = [Evidence(seconds, 1, *v).idleness for v in vcpus]
        return Evidence(seconds, len(vcpus), sum(v[0] for v in vcpus), sum(v[1] for v in vcpus),
                        sum(v[2] for v in vcpus), hazard, max(each) - min(each) if each else 0.0,
                        sum(1.0 - i for i in each))

    @property
    def idle(self) -> float:
        return max(self.seconds * self.vcpus - self.run - self.wait - self.costop, 0.0)

    @property
    def contention(self) -> float:
        wanted = self.run + self.wait + self.costop
        return (self.wait + self.costop) / wanted if wanted > 0 else 0.0

    @property
    def idleness(self) -> float:
        active = self.idle + self.run
        return self.idle / active if active > 0 else 0.0


BOOST = 0.45            # under the 0.5 that none or gang always reach
RELAXED_OF_BOOST = 0.8


def _ramp(x: float, lo: float, hi: float) -> float:
    return min(max((x - lo) / (hi - lo), 0.0), 1.0)


def scores(contention: float, idleness: float, coschedule: str = "gang", spread: float = 0.0,
           spins: float | None = None) -> dict[str, float]:
    """Each mode's score for these (smoothed) signals; ``coschedule`` names
    the strict mode that fits the host (gang or partial), the other gets 0.9
    of it. With KVM's counters (``spins``), contention counts only as far as
    the guest spins or halts (the module doc): one that does neither computes,
    and co-scheduling gains it nothing."""
    c = min(contention / CONTENDED, 1.0)
    if spins is not None:
        c *= max(_ramp(spins, *SPINNING), _ramp(idleness, *HALTING))
    idle = max(_ramp(idleness, *IDLENESS), _ramp(spread, *SPREAD))
    out = {"none": 1.0 - c * (1.0 - idle), "boost": BOOST * c, "relaxed": BOOST * c * RELAXED_OF_BOOST,
           "gang": c * (1.0 - idle), "partial": c * (1.0 - idle)}
    out["partial" if coschedule == "gang" else "gang"] *= 0.9
    return out


def _best(scores_: dict[str, float], allow, refused=()) -> str:
    """The best-scoring mode in ``allow`` outside ``refused`` (ties: the lower
    rung of :data:`LADDER`); ``none`` if none is left."""
    left = [m for m in LADDER if m in allow and m not in refused]
    return max(left, key=lambda m: scores_.get(m, 0.0)) if left else "none"


@dataclass
class Choice:
    """One guest's state under auto, and the last decision's reasons."""

    mode: str = "none"
    since: float = 0.0                    # when the mode last changed
    contention: float | None = None       # smoothed signals
    idleness: float | None = None
    hazard: float | None = None
    spread: float | None = None
    busy: float | None = None
    spins: float | None = None
    pending: str | None = None            # a better mode, and for how many decisions
    pending_n: int = 0
    scores: dict[str, float] = field(default_factory=dict)
    last: Evidence | None = None
    reason: str = "no evidence yet"


class Chooser:
    """The modes of all guests under auto. ``decide`` is called every window."""

    def __init__(self):
        self.guests: dict[str, Choice] = {}

    def mode(self, uuid: str) -> str:
        """The chosen mode (``none`` before the first choice)."""
        ch = self.guests.get(uuid)
        return ch.mode if ch else "none"

    def next_best(self, uuid: str, allow: tuple[str, ...], refused) -> str:
        """The best-scoring allowed mode outside ``refused``; ``none`` if no other is left."""
        return _best(self.guests[uuid].scores if uuid in self.guests else {}, allow, refused)

    def takes_cpus(self, uuid: str) -> bool:
        """Whether the guest competes for the host's CPUs and does not mostly
        sleep (smoothed signals): under ``none`` it would take a gang slot's CPUs."""
        ch = self.guests.get(uuid)
        return (ch is not None and ch.contention is not None and ch.contention >= CONTENDED
                and ch.idleness < HOSTED_IDLENESS)

    def busy(self, uuid: str) -> float:
        """The vCPUs' worth of work the guest keeps busy (smoothed; 1 before
        any evidence, to a tenth): what a hosted guest's share of the turn it
        shares is sized by (:func:`~cosched.policy.plan.hosted_turn_ms`)."""
        ch = self.guests.get(uuid)
        return round(ch.busy, 1) if ch is not None and ch.busy else 1.0

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
                            ("hazard", ev.hazard / ev.seconds), ("spread", ev.spread),
                            ("busy", ev.vcpus * (1.0 - ev.idleness) if ev.busy is None else ev.busy)):
            old = getattr(ch, name)
            setattr(ch, name, value if old is None else old + a * (value - old))
        ch.spins = None if ev.spins is None else ev.spins if ch.spins is None else ch.spins + a * (ev.spins - ch.spins)
        ch.last = ev
        ch.scores = scores(ch.contention, ch.idleness, coschedule, ch.spread, ch.spins)
        best = _best(ch.scores, allow)
        if ch.mode not in ([m for m in LADDER if m in allow] or ["none"]):     # the bounds changed: obey at once
            return self._change(ch, best, now, f"{ch.mode} is no longer allowed")
        gain = ch.scores[best] - ch.scores[ch.mode]
        raw = scores(ev.contention, ev.idleness, coschedule, ev.spread, ev.spins)
        if best != ch.mode and best != _best(raw, allow):
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
                                            f"(contention {ch.contention:.2f}, idleness {ch.idleness:.2f}, "
                                            f"spread {ch.spread:.2f})")

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
            "signals": {"contention": ch.contention, "idleness": ch.idleness, "spread": ch.spread, "busy": ch.busy,
                        "spins_per_run_second": ch.spins,
                        "hazard_per_second": ch.hazard},
            "last_window": None if last is None else {
                "seconds": last.seconds, "vcpus": last.vcpus, "run": last.run, "wait": last.wait,
                "costop": last.costop, "idle": last.idle, "spread": last.spread, "hazard": last.hazard,
                "spins": last.spins, "halts": last.halts},
            "scores": dict(ch.scores),
        }


class Auto:
    """Every guest under ``auto`` on a host: evidence in, modes out. Pure.

    :meth:`step` turns the sampler's cumulative figures (``views``, by uuid)
    and the engine's co-stop seconds (by (uuid, vCPU)) into one window of
    :class:`Evidence` per guest and lets the chooser decide; :meth:`settle`
    gives the snapshot the planner sees, each auto guest under its mode in
    force.

    The mode in force is the chosen one where the planner can take the guest
    under it. Where it cannot (a guest with more vCPUs than the pool has CPUs,
    a gang cell whose turns would stall its guests past ``max_stall_ms``,
    vCPUs not yet in cgroups of their own), the guest runs under the allowed
    mode that scores best among those the planner takes (``boost`` needs
    neither pinning nor freezing), else ``none``, and goes back to its choice
    as soon as the planner can take it: a full gang cell is the host's
    state, not the guest's, so it does not count as a change of mind.
    """

    def __init__(self):
        self.chooser = Chooser()
        # per guest: (seconds observed, hazard, {vCPU: (run, wait, costop)}, KVM's (spins, halts) or None), cumulative
        self._totals: dict[str, tuple] = {}
        self.in_force: dict[str, str] = {}
        self.hosted: dict[str, float] = {}                 # none guests hosted beside a gang: their busy vCPUs
        self.refused: dict[str, dict[str, str]] = {}      # per guest: chosen modes the planner refused, why
        self._why: dict[str, str] = {}                     # the chooser's reasons not yet logged

    def step(self, now: float, snap, views, costop, pool_cpus: int, kvm=None) -> list[tuple[str, str, str, str]]:
        """One decision for every auto guest; the choices that changed as
        (name, old, new, why). ``kvm``: KVM's cumulative counts by uuid
        (:class:`~cosched.sampler.kvm.KvmCounts`), for the guests that have them."""
        kvm = kvm or {}
        changes = []
        auto = _auto_guests(snap)
        keep = {d.uuid for d in auto}
        self.chooser.forget(keep)
        self._totals = {u: t for u, t in self._totals.items() if u in keep}
        self._why = {u: w for u, w in self._why.items() if u in keep}
        for d in auto:
            v = views.get(d.uuid)
            if v is None or not v.vcpus:
                continue
            k = kvm.get(d.uuid)
            totals = (v.observed, v.hazard,
                      {x.index: (x.run, x.wait + x.waiting, costop.get((d.uuid, x.index), 0.0)) for x in v.vcpus},
                      (k.spins, k.halts) if k is not None else None)
            before, self._totals[d.uuid] = self._totals.get(d.uuid), totals
            if before is None:
                continue
            seconds, hazard = max(totals[0] - before[0], 0.0), max(totals[1] - before[1], 0.0)
            window = [tuple(max(a - b, 0.0) for a, b in zip(now_, before[2][i]))
                      for i, now_ in totals[2].items() if i in before[2]]     # a vCPU plugged meanwhile waits
            ev = Evidence.of_vcpus(seconds, window, hazard)
            if totals[3] is not None and before[3] is not None and ev.run > 0:
                ev = replace(ev, spins=max(totals[3][0] - before[3][0], 0) / ev.run,
                             halts=max(totals[3][1] - before[3][1], 0) / ev.run)
            params = dict(d.policy.params)
            old = self.chooser.mode(d.uuid)
            coschedule = "partial" if pool_cpus >= 2 * len(d.vcpus) else "gang"
            mode, why = self.chooser.decide(d.uuid, now, ev,
                                            params["allow"], params["dwell-s"], coschedule)
            if why is not None:
                changes.append((d.name, old, mode, why))
                self._why[d.uuid] = why
        return changes

    def mode(self, uuid: str) -> str:
        """The mode in force (the choice, or what the planner took instead)."""
        return self.in_force.get(uuid, "none")

    def explain(self, uuid: str) -> dict | None:
        """The chooser's evidence, scores and decision, with the mode in force
        and any chosen modes the planner refused (``cosched explain``)."""
        got = self.chooser.explain(uuid)
        if got is None:
            return None
        return {**got, "mode": self.mode(uuid), "chosen": got["mode"], "refused": dict(self.refused.get(uuid, {})),
                "hosted": uuid in self.hosted}

    def settle(self, snap, planner: Callable):
        """``snap`` with each auto guest under its mode in force, and the
        changes of mode in force as (name, old, new, why).

        ``planner`` maps a snapshot to a plan (its ``rejected``: uuid to
        reason); a guest it rejects under a chosen mode drops to the best
        remaining allowed mode, and the planner is asked again; one it leaves
        alone (the platform's CPU decisions) runs under ``none``. A busy guest
        left to ``none`` is hosted (the module doc): where a gang cell
        rotates, the planner gives it a place in the turn that the hosted
        guests share."""
        if snap is None:
            return snap, []
        auto = _auto_guests(snap)
        chosen = {d.uuid: self.chooser.mode(d.uuid) for d in auto}
        modes, refused = dict(chosen), {d.uuid: {} for d in auto}
        hosted = {d.uuid: self.chooser.busy(d.uuid) for d in auto
                  if dict(d.policy.params)["slot"] and self.chooser.takes_cpus(d.uuid)}
        eff = _under(snap, modes, hosted)
        for _ in LADDER:                        # each round refuses one more mode to each guest it drops
            final = planner(eff)
            dropped = [d for d in auto if modes[d.uuid] != "none" and d.uuid in final.rejected]
            if not dropped:
                break
            for d in dropped:
                refused[d.uuid][modes[d.uuid]] = final.rejected[d.uuid]
                modes[d.uuid] = self.chooser.next_best(d.uuid, dict(d.policy.params)["allow"], refused[d.uuid])
            eff = _under(snap, modes, hosted)
        else:
            final = planner(eff)
        for d in auto:                          # the platform's decisions leave it alone: nothing to choose
            if d.uuid in final.left_alone and modes[d.uuid] != "none":
                refused[d.uuid][modes[d.uuid]] = final.left_alone[d.uuid]
                modes[d.uuid] = "none"
        # hosted where a gang cell took it; else free (no gang cell to join, or no room in it)
        self.hosted = {u: w for u, w in hosted.items() if modes[u] == "none" and final.cell_of(u) is not None}
        eff = _under(snap, modes, self.hosted)
        changes = []
        for d in auto:
            old, new, why = self.mode(d.uuid), modes[d.uuid], self._why.pop(d.uuid, None)
            if old == new:
                continue
            if new != chosen[d.uuid]:
                mode, reason = next(iter(refused[d.uuid].items()))
                why = f"{why + '; ' if why else ''}the planner cannot take {mode} ({reason}): {new} scores best of the rest"
            elif why is None:
                why = f"the planner can take {new} again"
            changes.append((d.name, old, new, why))
        self.in_force = modes
        self.refused = {u: r for u, r in refused.items() if r}
        return eff, changes


def _auto_guests(snap) -> list:
    return [d for d in snap.domains if d.policy is not None and d.policy.kind == "auto"] if snap else []


def _under(snap, modes: dict[str, str], hosted: dict[str, float] = {}):
    """``snap`` with each auto guest's policy replaced by its mode in ``modes``;
    a guest in ``hosted`` (uuid: the vCPUs' worth it keeps busy) under
    ``none`` is planned as :data:`~cosched.policy.plan.HOSTED`, with a gang
    guest's quantum, its ``busy`` figure, by which the shared turn is sized,
    and its ``keep-pct``, which bounds it."""
    def spec(d):
        mode = modes[d.uuid]
        if mode == "none" and d.uuid in hosted:
            keep = dict(d.policy.params)["keep-pct"]
            return replace(d.policy, kind=HOSTED,
                           params=resolve("gang", {}, {}) + (("busy", hosted[d.uuid]), ("keep-pct", keep)))
        return replace(d.policy, kind=mode, params=resolve(mode, {}, {}))
    domains = tuple(replace(d, policy=spec(d)) if d.uuid in modes and d.policy is not None and d.policy.kind == "auto"
                    else d for d in snap.domains)
    return replace(snap, domains=domains)
