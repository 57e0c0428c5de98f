"""boost / cfs aggregate throughput per row, from a suite results.json (same repetition)."""
import json, sys
r = json.load(open(sys.argv[1]))
agg = {}
for run in r["runs"]:
    if not run.get("valid"):
        continue
    tot = sum(v["rate"] for v in run["per_guest"].values())
    agg[(run["workload"], run["guests"], run["rep"], run["mode"])] = tot / run["ideal"]
for (w, n, rep, m), v in sorted(agg.items()):
    if m == "boost" and (w, n, rep, "cfs") in agg:
        print(f"{w} x{n} rep{rep}: boost {v:.1%} cfs {agg[(w,n,rep,'cfs')]:.1%} ratio {v/agg[(w,n,rep,'cfs')]:.2f}")
