"""The relaxed rows of `rows/`: each run's `relaxed` and `cfs` figures (% of
the ideal) per workload and guest count, by code version, in run order (the
`mixed-*` runs' own rows left out); then, from the `mixed-*` runs, each
mixed host's sum under `relaxed` and `auto`.

    python benchmarks/evidence/lopsided-pinned-apart/analyse.py
"""
import re
from pathlib import Path
from statistics import mean

ROWS = Path(__file__).parent / "rows"
LINE = re.compile(r"\| (\w+) \| (\d+) \| (\d+)% \S+ \| (\d+)% ")
MIXED = re.compile(r"^(\d+) guests:$")

table: dict = {}
mixed: dict = {}
for run in sorted(ROWS.iterdir(), key=lambda p: (p.name.split("-")[0], int(p.name.split("-")[-2]))):
    version = run.name.split("-")[-1]
    lines = (run / "summary.md").read_text().splitlines()
    if not run.name.startswith("mixed-"):
        for m in filter(None, map(LINE.match, lines)):
            table.setdefault((m[1], int(m[2])), {}).setdefault(version, []).append((int(m[4]), int(m[3])))
        continue
    n = None
    for line in lines:
        if MIXED.match(line):
            n = int(MIXED.match(line)[1])
        elif n and line.startswith(("| relaxed |", "| auto |")):
            mode = line.split("|")[1].strip()
            mixed.setdefault((n, mode), {}).setdefault(version, []).append(float(line.split("|")[-2]))
        elif line.startswith("## Phase"):
            n = None
for (workload, n), by in table.items():
    print(f"{workload} x{n}: " + "; ".join(
        f"{v} relaxed {[r for r, _ in by[v]]} mean {mean(r for r, _ in by[v]):.1f} (cfs {[c for _, c in by[v]]})"
        for v in ("old", "new")))
for (n, mode), by in sorted(mixed.items()):
    print(f"mixed x{n}, sum under {mode}: " + "; ".join(f"{v} {by[v]}" for v in ("old", "new")))
