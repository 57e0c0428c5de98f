"""Two 2-vCPU guests on 2 CPUs, each running one busy thread (`ep
threads=1`: one vCPU works, its sibling has nothing to do, as under a
parallel library that leaves a vCPU idle), under the host scheduler
unpinned (`none`), with every guest's vCPU i pinned to CPU i through
libvirt (`pinned`: siblings apart, the same placement in every guest), and
under `relaxed` (siblings apart, each guest starting where the previous
ended); alternated, reversed every other repetition, 5 s each after 3 s to
settle; throughput from the guests' live counters, in iterations per
second summed over the guests, and each guest's busy vCPU (the one with the
most run time in the interval, from /proc). Run as root from the
repository with libvirtd running (`python -m testbed.services`):

    PYTHONPATH=. .venv/bin/python benchmarks/evidence/lopsided-pinned-apart/probe.py [REPS]
"""
import os
import re
import subprocess
import sys
import time

from benchmarks.suite import set_policy, under_mode
from testbed import guests as G

MODES = ["none", "pinned", "relaxed"]


def vcpu_run(g):
    """vCPU index -> run time (ns) of one guest's vCPU threads, from /proc."""
    pid = int(open(f"/run/libvirt/qemu/{g.name}.pid").read())
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        m = re.match(r"CPU (\d+)/", open(f"/proc/{pid}/task/{tid}/comm").read())
        if m:
            out[int(m.group(1))] = int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[0])
    return out


def measure(gs, seconds):
    c0 = {g.name: (time.monotonic(), g.counters()["iters"], vcpu_run(g)) for g in gs}
    time.sleep(seconds)
    total, busy = 0.0, []
    for g in gs:
        t0, i0, r0 = c0[g.name]
        r1 = vcpu_run(g)
        total += (g.counters()["iters"] - i0) / (time.monotonic() - t0)
        busy.append(max(r1, key=lambda i: r1[i] - r0.get(i, 0)))
    return total, busy


def pin(gs, on):
    for g in gs:
        for i in range(2):
            subprocess.run(["virsh", "-c", G.URI, "vcpupin", g.name, str(i), str(i) if on else "0-1", "--live"],
                           check=True, capture_output=True)


with under_mode(["ep threads=1"] * 2, "none") as (daemon, gs):
    while any(g.counters() is None for g in gs):
        time.sleep(0.5)
    out = {m: [] for m in MODES}
    for k in range(int(sys.argv[1]) if len(sys.argv) > 1 else 4):
        for m in MODES if k % 2 == 0 else MODES[::-1]:
            for g in gs:
                set_policy(g.name, "relaxed" if m == "relaxed" else "none", {})
            pin(gs, m == "pinned")
            time.sleep(3.0)
            r, busy = measure(gs, 5.0)
            out[m].append(r)
            print(k, m, round(r, 1), "busy vCPUs", busy, flush=True)
        pin(gs, False)
    for m, v in out.items():
        print(m, [round(x) for x in v], round(sum(v) / len(v), 1))
