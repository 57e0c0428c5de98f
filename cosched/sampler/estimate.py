"""From schedstat samples to run, wait, skew, hazard and partial contention.

Pure arithmetic, no I/O. The sampler reads, every ``interval`` (default 10 ms),
each vCPU thread's ``/proc/PID/task/TID/schedstat``: cumulative nanoseconds
*run* on a CPU and *waited* runnable on a run queue (the kernel's
``sum_exec_runtime`` and ``run_delay``). A window is the time between two
samples, of length ``dt``.

Per vCPU and window
    ``r = Δrun``, ``w = Δwait``, both exact totals. The kernel credits them
    late, though: run time at the next tick (4 ms at HZ=250) or context
    switch, wait time only when the wait ends. So a window can be credited
    more than ``dt``; the excess is carried into the next windows (run first,
    then wait, each window holding at most ``dt``). Totals over any run are
    exact; only their placement in time is approximate, by at most one wait
    or one tick.
    A wait still in progress is not credited at all, so a vCPU left on a run
    queue for seconds would look idle until the wait ends. The sampler
    therefore also reads each thread's state (``/proc/.../stat``): a thread
    runnable (``R``) at both ends of a window in which it got no CPU time
    waited for the whole window. That wait is placed at once, as an
    *advance* that the kernel's later credit pays off instead of placing it
    again. The credit comes when the thread is switched in, before it runs,
    so once it has run, an unpaid advance was no wait and is dropped.
    ``idle = dt - r - w``: blocked or halted.

Skew (``cosched_domain_skew_seconds``)
    ``max_i lag_i - min_i lag_i`` with ``lag_i = w_i + costop_i``: how far the
    most-delayed vCPU fell behind the least-delayed one in the window. Exact up
    to the placement error above.

Concurrency hazard (``..._concurrency_hazard_seconds_total``)
    Time in the window when at least one vCPU ran while at least one sibling
    waited. Samples give each vCPU's totals, not when in the window they
    happened, so the estimate treats vCPUs as independent within one window,
    with ``p_run = r/dt`` and ``p_wait = w/dt``::

        hazard = dt * (1 - Π(1 - p_run) - Π(1 - p_wait) + Π(p_idle))

    The true value lies between the Fréchet bounds ``max(0, R + W - dt)`` and
    ``min(R, W)``, where ``R`` (``W``) is the time any vCPU ran (waited), itself
    between ``max r_i`` and ``min(dt, Σ r_i)``. :func:`hazard_bounds` computes
    them. The gap closes when a window holds a single state per vCPU, so the
    error shrinks with shorter windows: windows where every vCPU only ran, only
    waited or only idled are exact, and co-scheduled guests (all run, then all
    wait) are measured almost exactly.

    vCPUs queued on the *same* host CPU are not independent: one CPU runs one
    thread at a time, so two busy siblings there alternate and one always
    waits while the other runs (measured against kernel traces: 97% hazard,
    where independence says 50%). The sampler reads each thread's CPU
    (``/proc/.../stat``, field 39); siblings on the same CPU at both ends of
    the window form a *group* whose members never run together. Within a
    group, with ``q_j = p_idle_j / (1 - p_run_j)`` (idle, given not
    running)::

        P(none runs)  = 1 - Σ p_run
        P(none waits) = Σ_i p_run_i Π_{j≠i} q_j + (1 - Σ p_run) Π q_j
        P(all idle)   = (1 - Σ p_run) Π q_j

    and groups are independent of each other. A group of one gives back the
    formulas above.

Partial contention (``..._partial_contention_seconds_total``)
    Time when at least one vCPU waited while no sibling ran (the others were
    blocked, idle or waiting too)::

        partial = dt * (Π(1 - p_run) - Π(p_idle))
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
