"""Statistics for the benchmarks, and the exact hazard from kernel scheduler traces.

Pure functions, unit-tested on synthetic data.

The metric-truth benchmark records ``sched_switch`` and ``sched_wakeup``
events for the vCPU threads and turns them into per-thread state timelines
(:func:`states_at`, :func:`timelines`); :func:`trace_figures` then computes,
exactly, the same quantities cosched estimates from 10 ms schedstat windows:
concurrency hazard (some vCPU of the guest runs while a sibling is runnable
but waiting), partial contention (some vCPU waits while none runs), and
:func:`window_skews` the per-window skew, with cosched's definition of lag
(waiting or frozen, contracts §4): the trace also records when each vCPU's
cgroup is frozen and thawed, so a co-stopped vCPU is told from a sleeping one.
:func:`reconstructed` says how much of a timeline was not seen in events.
:func:`hazard_episodes` cuts the hazard into episodes per waiting vCPU and,
with the ``sched_setattr`` calls the trace saw, times ``boost``'s reaction.

Iteration times come from the guests as log-linear histograms (see
``testbed/workloads/guest-init.c``); :func:`hist_cdf` and
:func:`hist_quantile` read them.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

RUNNING, RUNNABLE, SLEEPING, FROZEN = "running", "runnable", "sleeping", "frozen"


def jain(values: list[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one gets everything."""
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values)) if any(values) else 0.0


def cdf(samples: list[float]) -> list[tuple[float, float]]:
    """Empirical CDF: ``(x, fraction of samples <= x)`` at each distinct value."""
    xs = sorted(samples)
    n = len(xs)
    return [(x, (i + 1) / n) for i, x in enumerate(xs) if i + 1 == n or xs[i + 1] != x]


def of_ideal(total: float, ideal: float) -> float:
    """Aggregate throughput as a fraction of one guest alone (0 when no ideal)."""
    return total / ideal if ideal > 0 else 0.0


def hist_bounds(i: int) -> tuple[float, float]:
    """Lower and upper bound, in seconds, of a guest histogram bucket."""
    def lower(j: int) -> int:
        return j if j < 4 else (4 + j % 4) << (j // 4 - 1)
    return lower(i) * 1e-6, lower(i + 1) * 1e-6


def hist_delta(before: dict[int, int], after: dict[int, int]) -> dict[int, int]:
    """Counts added between two cumulative histograms."""
    out = {b: n - before.get(b, 0) for b, n in after.items()}
    return {b: n for b, n in out.items() if n > 0}


def hist_add(*hists: dict[int, int]) -> dict[int, int]:
    out: dict[int, int] = {}
    for h in hists:
        for b, n in h.items():
            out[int(b)] = out.get(int(b), 0) + n   # JSON turns keys into strings
    return out


def hist_cdf(hist: dict[int, int]) -> list[tuple[float, float]]:
    """``(bucket upper bound in seconds, fraction of iterations at or below it)``."""
    total = sum(hist.values())
    out, running = [], 0
    for b in sorted(hist):
        running += hist[b]
        out.append((hist_bounds(b)[1], running / total))
    return out


def nearest_rank(xs: list[float], q: float) -> float:
    """Quantile ``q`` of samples ``xs`` (not empty): the sample at rank ``q * n``."""
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)]


def hist_quantile(hist: dict[int, int], q: float) -> float | None:
    """Upper bound (seconds) of the bucket holding quantile ``q``; None when empty."""
    return next((x for x, f in hist_cdf(hist) if f >= q), None) if hist else None


@dataclass(frozen=True)
class Event:
    """One scheduler event for a thread.

    ``kind``: ``in`` (switched onto a CPU), ``tick`` (seen running: the
    kernel accounted run time to it), ``out-runnable`` (preempted, still
    runnable), ``out-sleep`` (blocked, halted or frozen), ``wakeup``;
    ``freeze`` and ``thaw`` (its cgroup, or an ancestor, was frozen or thawed).
    """

    t: float
    tid: int
    kind: str


_AFTER = {"in": RUNNING, "tick": RUNNING, "out-runnable": RUNNABLE, "out-sleep": SLEEPING, "wakeup": RUNNABLE}
_BEFORE = {"in": RUNNABLE, "tick": RUNNING, "out-runnable": RUNNING, "out-sleep": RUNNING, "wakeup": SLEEPING}
_FREEZE = {"freeze": True, "thaw": False}


def states_at(events: list[Event], tids: set[int], t0: float, silent: dict[int, str] | None = None) -> dict[int, str]:
    """Each thread's state at ``t0``: set by its last event before ``t0``, or
    implied by its first event after (a thread switched in was waiting, one
    switched out was running, one woken was asleep). A thread with no event
    at all kept one state throughout, which the trace cannot tell: it is
    taken from ``silent`` (e.g. read from /proc), else sleeping. Whether
    it was frozen is :func:`frozen_at`'s."""
    return _at(events, tids, t0, _AFTER, _BEFORE, silent or {}, SLEEPING)


def frozen_at(events: list[Event], tids: set[int], t0: float) -> dict[int, bool]:
    """Whether each thread's cgroup was frozen at ``t0``, as :func:`states_at`
    finds its state: a thread thawed first was frozen before."""
    return _at(events, tids, t0, _FREEZE, {"freeze": False, "thaw": True}, {}, False)


def _at(events, tids, t0, after, before, silent, default):
    state: dict = {}
    for e in sorted(events, key=lambda e: e.t):
        if e.tid not in tids or e.kind not in after:
            continue
        if e.t <= t0:
            if not (e.kind == "wakeup" and state.get(e.tid) == RUNNING):
                state[e.tid] = after[e.kind]
        elif e.tid not in state:
            state[e.tid] = before[e.kind]
    return {tid: state.get(tid, silent.get(tid, default)) for tid in tids}


def reconstructed(events: list[Event], tids: set[int], t0: float, t1: float) -> dict[int, float]:
    """Per thread, the seconds of ``[t0, t1]`` whose state no event showed:
    from ``t0`` to its first event when none came before ``t0`` (implied by
    that event), the whole window when it has none (read from /proc)."""
    seen_before = {e.tid for e in events if e.t <= t0 and e.kind in _AFTER}
    first = {}
    for e in events:
        if e.kind in _AFTER and t0 < e.t <= t1:
            first[e.tid] = min(first.get(e.tid, t1), e.t)
    return {tid: 0.0 if tid in seen_before else first.get(tid, t1) - t0 for tid in tids}


def timelines(events: list[Event], start: dict[int, str], t0: float, t1: float,
              frozen: dict[int, bool] | None = None) -> dict[int, list[tuple[float, float, str]]]:
    """Per thread, ``(begin, end, state)`` intervals covering ``[t0, t1]``.

    ``start`` gives each thread's state at ``t0`` and ``frozen`` whether its
    cgroup was frozen then; events outside the window are ignored. A thread
    not running while its cgroup is frozen is ``FROZEN`` (co-stopped), not
    waiting or sleeping; one still running (it stops on its way back to
    user space) is running.
    """
    out: dict[int, list[tuple[float, float, str]]] = {}
    base = dict(start)
    cold = {tid: bool((frozen or {}).get(tid)) for tid in start}

    def shown(tid):
        return FROZEN if cold[tid] and base[tid] != RUNNING else base[tid]
    state = {tid: shown(tid) for tid in start}
    since = {tid: t0 for tid in start}
    for e in sorted(events, key=lambda e: e.t):
        if e.tid not in state or not t0 <= e.t <= t1:
            continue
        if e.kind in _FREEZE:
            cold[e.tid] = _FREEZE[e.kind]
        elif not (e.kind == "wakeup" and base[e.tid] == RUNNING):   # waking a running thread changes nothing
            base[e.tid] = _AFTER[e.kind]
        new = shown(e.tid)
        if new != state[e.tid]:
            if e.t > since[e.tid]:
                out.setdefault(e.tid, []).append((since[e.tid], e.t, state[e.tid]))
            state[e.tid], since[e.tid] = new, e.t
    for tid in state:
        out.setdefault(tid, []).append((since[tid], t1, state[tid]))
    return out


def trace_figures(lines: dict[int, list[tuple[float, float, str]]]) -> dict:
    """Exact hazard, partial-contention and per-thread run, wait and frozen time of one guest's vCPUs,
    and ``together``: the time every one of them was on a CPU at once (the
    only time a spin barrier among all of them can be crossed).

    One sweep over every state change of every thread, in time order.
    """
    changes = [(b, tid, s) for b, _, tid, s in
               sorted((b, k, tid, s) for tid, iv in lines.items() for k, (b, _, s) in enumerate(iv))]
    end = max(e for iv in lines.values() for _, e, _ in iv)
    hazard = partial = together = 0.0
    run = {tid: 0.0 for tid in lines}
    wait = {tid: 0.0 for tid in lines}
    frozen = {tid: 0.0 for tid in lines}
    state: dict[int, str] = {}
    for (t, tid, s), nxt in zip(changes, changes[1:] + [(end, None, None)]):
        state[tid] = s
        dt = nxt[0] - t
        if dt <= 0:
            continue
        running = waiting = 0
        for k, st in state.items():
            if st == RUNNING:
                running += 1
                run[k] += dt
            elif st == RUNNABLE:
                waiting += 1
                wait[k] += dt
            elif st == FROZEN:
                frozen[k] += dt
        if running and waiting:
            hazard += dt
        elif waiting:
            partial += dt
        if running == len(lines):
            together += dt
    return {"hazard": hazard, "partial": partial, "together": together, "run": run, "wait": wait, "frozen": frozen}


def window_skews(lines: dict[int, list[tuple[float, float, str]]], t0: float, t1: float, width: float) -> list[float]:
    """Per window of ``width`` seconds in ``[t0, t1)``: the largest difference
    between two threads' lag, lag being the time a thread waited or was
    frozen (cosched's wait + costop). Sleeping is not lag: an idle vCPU
    does not fall behind."""
    n = int((t1 - t0) / width + 1e-9)        # whole windows (and not one fewer for a rounding error)
    lags = {tid: [0.0] * n for tid in lines}
    for tid, iv in lines.items():
        for b, e, s in iv:
            if s not in (RUNNABLE, FROZEN):
                continue
            k = max(int((b - t0) / width), 0)
            while k < n and t0 + k * width < e:
                lo, hi = max(b, t0 + k * width), min(e, t0 + (k + 1) * width)
                lags[tid][k] += max(hi - lo, 0.0)
                k += 1
    return [max(col) - min(col) for col in zip(*lags.values())] if lags else []


def hazard_episodes(lines: dict[int, list[tuple[float, float, str]]],
                    calls: list[tuple[float, int, bool, bool]]) -> list[tuple[float, float | None]]:
    """Each hazard episode of one guest: a stretch in which one vCPU was
    runnable but not running while a sibling ran, as ``(seconds, reaction)``.
    ``reaction`` is the time from the episode's start to the first boost of
    that vCPU within it: a successful ``sched_setattr`` after which the
    thread showed a realtime or deadline priority (``calls``: ``(t, tid,
    succeeded, raised)``, :func:`benchmarks.trace.setattr_calls`); None when
    there was none. A return from a boost is a call too, and can reach a
    vCPU while it waits (a boost that ran out): it is no reaction."""
    out = []
    for tid, iv in lines.items():
        union: list[list[float]] = []          # the siblings' running, as sorted disjoint stretches
        for b, e in sorted((b, e) for k, kiv in lines.items() if k != tid for b, e, s in kiv if s == RUNNING):
            if union and b <= union[-1][1]:
                union[-1][1] = max(union[-1][1], e)
            else:
                union.append([b, e])
        ends = [e for _, e in union]
        hits = sorted(t for t, target, ok, raised in calls if target == tid and ok and raised)
        for b, e, s in iv:
            if s != RUNNABLE:
                continue
            i = bisect.bisect_right(ends, b)       # the first stretch that ends after the wait began
            while i < len(union) and union[i][0] < e:
                lo, hi = max(union[i][0], b), min(union[i][1], e)
                k = bisect.bisect_left(hits, lo)
                out.append((hi - lo, hits[k] - lo if k < len(hits) and hits[k] <= hi else None))
                i += 1
    return out


def episode_figures(episodes: list[tuple[float, float | None]], react_s: float = 0.001) -> dict:
    """Hazard episodes summed up (times in ms): how many, their length at
    p50/p90, how many lasted longer than ``react_s``, and of those **due** a
    reaction the share boosted within ``react_s`` of their start (over one
    half: the median reaction is within it) and the median reaction of those
    boosted at all. An episode is due when it lasted longer than ``react_s``
    or was boosted within it: a boost in time may end its episode sooner
    (that is what it is for), and counted by length alone the episodes it
    ended would drop out, leaving only the boosts that failed (measured: a
    boost of every waiting vCPU at first sight left 8 episodes over 1 ms of
    10,288 boosts, 12% of them boosted in time;
    ``docs/decisions/0011-fifo-boosts-within-a-deadline-period.md``)."""
    def q(xs, f):
        return 1000 * nearest_rank(xs, f) if xs else None
    due = [(d, r) for d, r in episodes if d > react_s or (r is not None and r <= react_s)]
    reacted = [r for _, r in due if r is not None]
    return {"n": len(episodes), "p50_ms": q([d for d, _ in episodes], 0.5),
            "p90_ms": q([d for d, _ in episodes], 0.9), "long": sum(1 for d, _ in episodes if d > react_s),
            "due": len(due),
            "due_in_time": sum(1 for r in reacted if r <= react_s) / len(due) if due else None,
            "reaction_p50_ms": q(reacted, 0.5)}
