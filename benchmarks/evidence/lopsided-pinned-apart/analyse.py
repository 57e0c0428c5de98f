"""The relaxed rows of `rows/`: each run's `relaxed` and `cfs` figures (% of
the ideal) per workload and guest count, by code version, in run order.

    python benchmarks/evidence/lopsided-pinned-apart/analyse.py
"""
import re
from pathlib import Path
from statistics import mean

ROWS = Path(__file__).parent / "rows"
LINE = re.compile(r"\| (\w+) \| (\d+) \| (\d+)% \S+ \| (\d+)% ")

table: dict = {}
for run in sorted(ROWS.iterdir(), key=lambda p: (p.name.startswith("pingpong"), int(p.name.split("-")[-2]))):
    version = run.name.split("-")[-1]
    for m in map(LINE.match, (run / "summary.md").read_text().splitlines()):
        if m:
            table.setdefault((m[1], int(m[2])), {}).setdefault(version, []).append((int(m[4]), int(m[3])))
for (workload, n), by in table.items():
    print(f"{workload} x{n}: " + "; ".join(
        f"{v} relaxed {[r for r, _ in by[v]]} mean {mean(r for r, _ in by[v]):.1f} (cfs {[c for _, c in by[v]]})"
        for v in ("old", "new")))
