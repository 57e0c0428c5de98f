"""A 3-vCPU `barrier` guest on 2 CPUs (more vCPUs than the pool has CPUs:
gang cannot take it) under the host scheduler (`none`), under `boost`, and
under `auto` (which chooses gang and, refused, runs it under the best mode
left); alternated, reversed every other repetition, 5 s each after 6 s to
settle (auto chooses within about 3 s); throughput from the guest's live
counters, in iterations per second; for auto, the mode status showed. Run
as root from the repository with libvirtd running (`python -m testbed.services`):

    PYTHONPATH=. .venv/bin/python benchmarks/evidence/auto-larger-than-pool/probe.py [REPS] [VCPUS]
"""
import sys
import time

from benchmarks.suite import set_policy, under_mode

MODES = ["none", "boost", "auto"]
REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 4
VCPUS = int(sys.argv[2]) if len(sys.argv) > 2 else 3


def rate(g, seconds):
    t0, c0 = time.monotonic(), g.counters()["iters"]
    time.sleep(seconds)
    return (g.counters()["iters"] - c0) / (time.monotonic() - t0)


with under_mode(["barrier"], "none", vcpus=VCPUS) as (daemon, (g,)):
    while g.counters() is None:
        time.sleep(0.5)
    out = {m: [] for m in MODES}
    for k in range(REPS):
        for m in MODES if k % 2 == 0 else MODES[::-1]:
            set_policy(g.name, m, {})
            time.sleep(6.0)
            r = rate(g, 5.0)
            dom = daemon.domain(g.name) or {}
            out[m].append(r)
            print(k, m, round(r, 1), "status mode", dom.get("mode"), "error", dom.get("error"), flush=True)
    for m, v in out.items():
        print(m, [round(x) for x in v], round(sum(v) / len(v), 1))
