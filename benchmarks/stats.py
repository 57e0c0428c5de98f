"""Statistics for the benchmarks, and the exact hazard from kernel scheduler traces.

Pure functions, unit-tested on synthetic data.

The metric-truth benchmark records ``sched_switch`` and ``sched_wakeup``
events for the vCPU threads and turns them into per-thread state timelines
(:func:`timelines`); :func:`trace_figures` then computes, exactly, the same
quantities cosched estimates from 10 ms schedstat windows: concurrency
hazard (some vCPU of the guest runs while a sibling is runnable but waiting)
and partial contention (some vCPU waits while none runs).
"""
from __future__ import annotations

from dataclasses import dataclass

RUNNING, RUNNABLE, SLEEPING = "running", "runnable", "sleeping"


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


@dataclass(frozen=True)
class Event:
    """One scheduler event for a thread.

    ``kind``: ``in`` (switched onto a CPU), ``out-runnable`` (preempted, still
    runnable), ``out-sleep`` (blocked, halted or frozen), ``wakeup``.
    """

    t: float
    tid: int
    kind: str


def timelines(events: list[Event], start: dict[int, str], t0: float, t1: float) -> dict[int, list[tuple[float, float, str]]]:
    """Per thread, ``(begin, end, state)`` intervals covering ``[t0, t1]``.

    ``start`` gives each thread's state at ``t0``; events outside the window
    are ignored.
    """
    nxt = {"in": RUNNING, "out-runnable": RUNNABLE, "out-sleep": SLEEPING, "wakeup": RUNNABLE}
    out: dict[int, list[tuple[float, float, str]]] = {}
    state = dict(start)
    since = {tid: t0 for tid in start}
    for e in sorted(events, key=lambda e: e.t):
        if e.tid not in state or not t0 <= e.t <= t1:
            continue
        new = nxt[e.kind]
        if e.kind == "wakeup" and state[e.tid] == RUNNING:
            continue                      # a wakeup of a running thread changes nothing
        if new != state[e.tid]:
            out.setdefault(e.tid, []).append((since[e.tid], e.t, state[e.tid]))
            state[e.tid], since[e.tid] = new, e.t
    for tid in state:
        out.setdefault(tid, []).append((since[tid], t1, state[tid]))
    return out


def trace_figures(lines: dict[int, list[tuple[float, float, str]]]) -> dict[str, float]:
    """Exact hazard, partial-contention and per-thread run/wait time of one guest's vCPUs."""
    points = sorted({p for iv in lines.values() for b, e, _ in iv for p in (b, e)})
    hazard = partial = 0.0
    run = {tid: 0.0 for tid in lines}
    wait = {tid: 0.0 for tid in lines}
    for a, b in zip(points, points[1:]):
        mid = (a + b) / 2
        states = {tid: next(s for beg, end, s in iv if beg <= mid < end) for tid, iv in lines.items()}
        running = sum(s == RUNNING for s in states.values())
        waiting = sum(s == RUNNABLE for s in states.values())
        if running and waiting:
            hazard += b - a
        if waiting and not running:
            partial += b - a
        for tid, s in states.items():
            if s == RUNNING:
                run[tid] += b - a
            elif s == RUNNABLE:
                wait[tid] += b - a
    return {"hazard": hazard, "partial": partial, "run": run, "wait": wait}
