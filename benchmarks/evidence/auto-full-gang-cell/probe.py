"""Three 2-vCPU `barrier` guests on 2 CPUs with `max_stall_ms = 60`, so the
gang cell has room for two 50 ms turns: under `auto` all three choose gang,
two get it and the third goes to the next score (`partial`, which on a
pool no wider than the guest is a cell of its own, run as relaxed). The
same placement by annotation: the first two under `gang`, the third under
`relaxed` or under `boost`. Alternated, reversed every other repetition,
5 s each after 6 s to settle (auto after 8 s); throughput from the guests'
live counters, in iterations per second, per guest; and the modes status
showed. Run as root from the repository with libvirtd running
(`python -m testbed.services`):

    PYTHONPATH=. .venv/bin/python benchmarks/evidence/auto-full-gang-cell/probe.py [REPS]
"""
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.suite import boot_set, set_policy
from testbed import image
from testbed.daemon import DaemonProcess

CONDITIONS = {"auto": ("auto", "auto", "auto"), "third-relaxed": ("gang", "gang", "relaxed"),
              "third-boost": ("gang", "gang", "boost")}


def rates(gs, seconds):
    c0 = {g.name: (time.monotonic(), g.counters()["iters"]) for g in gs}
    time.sleep(seconds)
    return [(g.counters()["iters"] - c0[g.name][1]) / (time.monotonic() - c0[g.name][0]) for g in gs]


gs = []
try:
    boot_set(["barrier"] * 3, 2, image.build(), gs)
    with tempfile.TemporaryDirectory() as tmp:
        daemon = DaemonProcess(Path(tmp), extra_config="max_stall_ms = 60\n").start()
        try:
            out = {c: [] for c in CONDITIONS}
            names = list(CONDITIONS)
            for k in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
                for c in names if k % 2 == 0 else names[::-1]:
                    for g, preset in zip(gs, CONDITIONS[c]):
                        set_policy(g.name, "none", {})
                    time.sleep(1.0)                  # auto starts afresh
                    for g, preset in zip(gs, CONDITIONS[c]):
                        set_policy(g.name, preset, {})
                    time.sleep(8.0 if c == "auto" else 6.0)
                    r = rates(gs, 5.0)
                    modes = [(daemon.domain(g.name) or {}).get("mode") for g in gs]
                    out[c].append(r)
                    print(k, c, [round(x) for x in r], "sum", round(sum(r)), "modes", modes, flush=True)
            for c, v in out.items():
                print(c, "third", [round(r[2]) for r in v], "sum", [round(sum(r)) for r in v])
        finally:
            daemon.stop()
finally:
    for g in gs:
        g.destroy()
