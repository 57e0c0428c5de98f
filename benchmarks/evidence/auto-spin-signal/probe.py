"""Do a spinning guest's vCPU threads show it from outside? Two guests of
each workload under the host scheduler (none) and under gang: per vCPU
thread, its voluntary and involuntary context switches per second and its
share of the time on a CPU and waiting for one (/proc/TID/status and
schedstat), and the guests' throughput, over the same 10 s.

    python benchmarks/evidence/auto-spin-signal/probe.py [WORKLOAD ...] > probe.txt

(from the project's root, PYTHONPATH=.; raw figures to probe.json here)
"""
import json
import re
import sys
import time

from benchmarks.suite import WORKLOADS, under_mode
from testbed import guests

SECONDS = 10.0


def snap(tids):
    out = {}
    for t in tids:
        st = open(f"/proc/{t}/status").read()
        run, wait, _ = open(f"/proc/{t}/schedstat").read().split()
        out[t] = (int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", st, re.M)[1]),
                  int(re.search(r"^nonvoluntary_ctxt_switches:\s+(\d+)", st, re.M)[1]), int(run), int(wait))
    return out


def main(wls):
    rows = []
    for wl in wls:
        for mode in ("none", "gang"):
            with under_mode([wl, wl], mode) as (daemon, gs):
                time.sleep(3)
                tids = {t: (g.name, i) for g in gs for t, i in sorted(guests.vcpu_threads(g.name).items())}
                c0 = {g.name: g.counters() for g in gs}
                a, t0 = snap(tids), time.monotonic()
                time.sleep(SECONDS)
                b, dt = snap(tids), time.monotonic() - t0
                c1 = {g.name: g.counters() for g in gs}
                rate = sum((c1[n]["iters"] - c0[n]["iters"]) / dt for n in c0)
                per = []
                for t, (name, i) in tids.items():
                    d = [y - x for x, y in zip(a[t], b[t])]
                    per.append({"guest": name[-1], "vcpu": i, "vol_s": d[0] / dt, "invol_s": d[1] / dt,
                                "run": d[2] / dt / 1e9, "wait": d[3] / dt / 1e9})
                rows.append({"workload": wl, "mode": mode, "iters_s": rate, "vcpus": per})
                vol = sum(p["vol_s"] for p in per) / len(per)
                run = sum(p["run"] for p in per) / len(per)
                print(f"{wl:9s} {mode:5s} {rate:10.1f} it/s  vol/s {vol:7.0f}  per run-s {vol / max(run, 1e-3):7.0f}  "
                      + "  ".join(f"{p['guest']}/{p['vcpu']}: v{p['vol_s']:.0f} i{p['invol_s']:.0f} "
                                  f"r{p['run']:.2f} w{p['wait']:.2f}" for p in per), flush=True)
    with open(__file__.rsplit("/", 1)[0] + "/probe.json", "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:] or list(WORKLOADS))
