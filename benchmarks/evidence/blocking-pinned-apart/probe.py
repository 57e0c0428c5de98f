"""2-vCPU `blocking` guests on 2 CPUs under the host scheduler unpinned
(`none`), under the host scheduler with each guest's siblings pinned apart
(vCPU i on CPU i, through libvirt), and under `relaxed`; alternated, 5 s
each after 2 s to settle; throughput from the guests' live counters, in
iterations per second summed over the guests. Run as root from the
repository with libvirtd running (`python -m testbed.services`):

    PYTHONPATH=. .venv/bin/python benchmarks/evidence/blocking-pinned-apart/probe.py [REPS] [GUESTS]
"""
import subprocess
import sys
import time

from benchmarks.suite import set_policy, under_mode
from testbed import guests as G


def rate(gs, seconds):
    c0 = {g.name: (time.monotonic(), g.counters()["iters"]) for g in gs}
    time.sleep(seconds)
    c1 = {g.name: (time.monotonic(), g.counters()["iters"]) for g in gs}
    return sum((c1[n][1] - c0[n][1]) / (c1[n][0] - c0[n][0]) for n in c0)


def pin(gs, on):
    for g in gs:
        for i in range(2):
            subprocess.run(["virsh", "-c", G.URI, "vcpupin", g.name, str(i), str(i) if on else "0-1", "--live"],
                           check=True, capture_output=True)


with under_mode(["blocking"] * int(sys.argv[2] if len(sys.argv) > 2 else 2), "none") as (daemon, gs):
    while any(g.counters() is None for g in gs):
        time.sleep(0.5)
    out = {"none": [], "pinned": [], "relaxed": []}
    for k in range(int(sys.argv[1]) if len(sys.argv) > 1 else 4):
        order = ["none", "pinned", "relaxed"] if k % 2 == 0 else ["relaxed", "pinned", "none"]
        for m in order:
            for g in gs:
                set_policy(g.name, "relaxed" if m == "relaxed" else "none", {})
            pin(gs, m == "pinned")
            time.sleep(2.0)
            r = rate(gs, 5.0)
            out[m].append(r)
            print(k, m, round(r, 1), flush=True)
        pin(gs, False)
    for m, v in out.items():
        print(m, [round(x) for x in v], round(sum(v) / len(v), 1))
