"""Longest waits of relaxed guests' vCPUs, from the kernel trace: per vCPU,
its longest wait for a CPU, and its longest wait while a sibling was
co-stopped (frozen), over 10 s, N barrier guests under a mode.

    PYTHONPATH=. python benchmarks/evidence/relaxed-laggard-waits/probe.py [MODE [N]]
"""
import sys, time

from benchmarks.suite import under_mode, v2_cgroup, proc_states, silent_states
from benchmarks.stats import timelines, states_at, frozen_at, RUNNABLE, FROZEN
from benchmarks.trace import SchedTrace
from testbed import guests

SECONDS = 10.0
mode = sys.argv[1] if len(sys.argv) > 1 else "relaxed"
n = int(sys.argv[2]) if len(sys.argv) > 2 else 2
with under_mode(["barrier"] * n, mode) as (daemon, gs):
    time.sleep(3)
    pids = {t: guests.qemu_pid(g.name) for g in gs for t in guests.vcpu_threads(g.name)}
    per = {g.name: sorted(guests.vcpu_threads(g.name)) for g in gs}
    with SchedTrace(set(pids), {t: v2_cgroup(p, t) for t, p in pids.items()}) as tr:
        time.sleep(0.5)
        p0, t0 = proc_states(pids), time.monotonic()
        time.sleep(SECONDS)
        p1, t1 = proc_states(pids), time.monotonic()
    print("overruns", tr.overruns, "events", len(tr.events))
for name, tids in per.items():
    lines = timelines(tr.events, states_at(tr.events, set(tids), t0, silent_states(p0, p1, t1 - t0)), t0, t1,
                      frozen_at(tr.events, set(tids), t0))
    for tid in tids:
        waits = [(e - b) for b, e, s in lines[tid] if s == RUNNABLE]
        sib = [t for t in tids if t != tid][0]
        fro = [(b, e) for b, e, s in lines[sib] if s == FROZEN]
        both = []
        for b, e, s in lines[tid]:
            if s != RUNNABLE:
                continue
            ov = sum(max(0.0, min(e, fe) - max(b, fb)) for fb, fe in fro)
            both.append(ov)
        waits.sort()
        print(name, tid, "waits", len(waits), "p50 %.2f ms p99 %.2f ms max %.1f ms" % (
            1000 * waits[len(waits) // 2], 1000 * waits[int(len(waits) * 0.99)], 1000 * waits[-1]) if waits else "",
            "longest wait beside a frozen sibling %.1f ms" % (1000 * max(both)) if both else "")
