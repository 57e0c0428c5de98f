"""From schedstat samples to run, wait, skew, hazard and partial contention.

Pure arithmetic, no I/O. The sampler reads, every ``interval`` (default 10 ms),
each vCPU thread's ``/proc/PID/task/TID/schedstat``: cumulative nanoseconds
*run* on a CPU and *waited* runnable on a run queue (the kernel's
``sum_exec_runtime`` and ``run_delay``). A window is the time between two
samples, of length ``dt``.

How it works, with the measurements behind it: ``docs/design/estimate.md``.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

CARRY_LIMIT = 1.0     # seconds; more pending than this means lost samples: drop it
ADVANCE_LIMIT = 600.0  # seconds of wait placed ahead of the kernel's credit


@dataclass
class VcpuCarry:
    """Run and wait credited by the kernel but not yet placed in a window
    (``run``, ``wait``), and wait placed but not yet credited (``advance``)."""

    run: float = 0.0
    wait: float = 0.0
    advance: float = 0.0


def place(carry: VcpuCarry, d_run: float, d_wait: float, dt: float, waiting: bool = False) -> tuple[float, float]:
    """Place newly credited run/wait into a window of ``dt``; update ``carry``.

    ``waiting``: the thread was runnable at both ends of the window; if it
    got no CPU time in it either, the window was one uncredited wait.
    """
    credit = max(d_wait, 0.0)
    paid = min(credit, carry.advance)
    carry.advance -= paid
    run = carry.run + max(d_run, 0.0)
    wait = carry.wait + credit - paid
    r = min(run, dt)
    w = min(wait, dt - r)
    carry.run = min(run - r, CARRY_LIMIT)
    carry.wait = min(wait - w, CARRY_LIMIT)
    if waiting and d_run <= 0 and r == 0:
        carry.advance = min(carry.advance + dt - w, ADVANCE_LIMIT)
        w = dt
    elif d_run > 0:
        # it ran: a real wait was credited when it was switched in, so what
        # is left unpaid was no wait but run time not credited yet (a CPU
        # without ticks, nohz_full, credits a lone running thread late)
        carry.advance = 0.0
    return r, w


@dataclass(frozen=True)
class Window:
    """One domain's estimates for one window, in seconds."""

    dt: float
    hazard: float
    partial: float
    skew: float


def estimate(dt: float, placed: list[tuple[float, float]], costop: list[float] | None = None,
             cpus: list[int | None] | None = None) -> Window:
    """Estimates for one domain from its vCPUs' placed ``(r, w)`` in a window.

    ``cpus``: the host CPU each vCPU stayed queued on through the window
    (None: unknown or moved); vCPUs sharing one are a mutually exclusive group.
    """
    if dt <= 0 or not placed:
        return Window(dt, 0.0, 0.0, 0.0)
    costop = costop or [0.0] * len(placed)
    cpus = cpus or [None] * len(placed)
    p_run = [min(r / dt, 1.0) for r, _ in placed]
    p_wait = [min(w / dt, 1.0 - pr) for (_, w), pr in zip(placed, p_run)]
    p_idle = [max(1.0 - pr - pw, 0.0) for pr, pw in zip(p_run, p_wait)]
    groups: dict[object, list[int]] = {}
    for i, cpu in enumerate(cpus):
        groups.setdefault(("cpu", cpu) if cpu is not None else ("alone", i), []).append(i)
    none_run = none_wait = all_idle = 1.0
    for members in groups.values():
        busy = min(sum(p_run[i] for i in members), 1.0)
        q = {i: p_idle[i] / (1.0 - p_run[i]) if p_run[i] < 1.0 else 1.0 for i in members}
        idle_rest = prod(q.values())
        none_run *= 1.0 - busy
        none_wait *= sum(p_run[i] * prod(q[j] for j in members if j != i) for i in members) + (1.0 - busy) * idle_rest
        all_idle *= (1.0 - busy) * idle_rest
    hazard = dt * max(1.0 - none_run - none_wait + all_idle, 0.0) if len(placed) > 1 else 0.0
    partial = dt * max(none_run - all_idle, 0.0)
    lags = [w + c for (_, w), c in zip(placed, costop)]
    return Window(dt, hazard, partial, max(lags) - min(lags))


def hazard_bounds(dt: float, placed: list[tuple[float, float]]) -> tuple[float, float]:
    """Lower and upper bound of the true hazard time in a window."""
    if len(placed) < 2:
        return 0.0, 0.0
    runs = [r for r, _ in placed]
    waits = [w for _, w in placed]
    lower = max(0.0, max(runs) + max(waits) - dt)
    upper = min(min(dt, sum(runs)), min(dt, sum(waits)))
    return min(lower, upper), upper
