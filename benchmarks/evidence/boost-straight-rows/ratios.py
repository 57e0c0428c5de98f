"""Per repetition, each mode's throughput of the ideal and boost against cfs, from a
suite's results.json: python3 ratios.py results.json"""
import json
import sys
from collections import defaultdict

cells = defaultdict(dict)
for r in json.load(open(sys.argv[1]))["runs"]:
    if r.get("valid", True) and r["mode"] != "alone" and r.get("ideal"):
        cells[(r["workload"], r["guests"], r["rep"])][r["mode"]] = \
            sum(g["rate"] for g in r["per_guest"].values()) / r["ideal"]
for (workload, guests, rep), c in sorted(cells.items()):
    print(workload, guests, f"rep {rep + 1}:", f"cfs {c['cfs']:.0%}, boost {c['boost']:.0%}, {c['boost'] / c['cfs']:.2f}x")
