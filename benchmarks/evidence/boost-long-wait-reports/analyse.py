"""Per sitting and row: boost / cfs throughput (same run), the daemon's and
switcher's CPU under boost (% of a CPU), and from the kernel trace the waits
due a boost, the share boosted within 1 ms and the median time to the boost.
Run in runs/: python3 ../analyse.py P-0 V1-0 ... (one table per sitting), or
python3 ../analyse.py --ranges (per row and variant, the range over its sittings)."""
import json
import sys
from pathlib import Path


def reactions(summary: Path) -> dict:
    out = {}
    for line in summary.read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 16 and cells[2] == "boost" and cells[1].isdigit():
            out[(cells[0], int(cells[1]))] = (cells[6], cells[7], cells[8], cells[9])
    return out


def rows(d: Path) -> dict:
    runs = json.loads((d / "results.json").read_text())["runs"]
    got = {}
    for r in runs:
        if r["mode"] not in ("cfs", "boost") or not r["valid"]:
            continue
        total = sum(g["rate"] for g in r["per_guest"].values())
        got.setdefault((r["workload"], r["guests"]), {})[r["mode"]] = (total / r["ideal"], r["daemon_cpu_pct"])
    return got


def sittings(names: list[str]) -> None:
    for name in names:
        d = Path(name)
        th, re_ = rows(d), reactions(d / "summary.md")
        print(f"## {name}")
        print("| row | boost/cfs | boost % ideal | CPU % | due | within 1 ms | p50 ms | boosts |")
        for key in sorted(th):
            m = th[key]
            if "boost" not in m or "cfs" not in m:
                print(f"| {key} | incomplete |")
                continue
            due, within, p50, boosts = re_.get(key, ("?",) * 4)
            ratio = f"{m['boost'][0] / m['cfs'][0]:.2f}" if m['cfs'][0] else "-"     # cfs may starve a barrier to 0
            print(f"| {key[0]} x{key[1]} | {ratio} | {m['boost'][0]:.0%} | "
                  f"{m['boost'][1]:.1f} | {due} | {within} | {p50} | {boosts} |")


def ranges(groups: dict[str, list[str]]) -> None:
    """Per row and group of sittings: the range over its sittings of each figure."""
    data = {}
    for group, names in groups.items():
        for name in names:
            d = Path(name)
            th, re_ = rows(d), reactions(d / "summary.md")
            for key, m in th.items():
                if "boost" in m and "cfs" in m:
                    due, within, p50, boosts = re_[key]
                    data.setdefault((key, group), []).append(
                        (m["boost"][0] * 100, m["boost"][0] / m["cfs"][0], m["boost"][1], int(within.rstrip("%")),
                         float(p50), int(boosts)))
    keys = sorted({k for k, _ in data})

    def span(vals, fmt):
        lo, hi = min(vals), max(vals)
        return fmt.format(lo) if lo == hi else f"{fmt.format(lo)}-{fmt.format(hi)}"
    print("| row | sittings | boost, % of ideal | boost / cfs | CPU % | within 1 ms | p50 ms | boosts |")
    print("|---|---|---|---|---|---|---|---|")
    for key in keys:
        for group in groups:
            v = data.get((key, group))
            if not v:
                continue
            cols = list(zip(*v))
            print(f"| {key[0]} x{key[1]} | {group} ({len(v)}) | {span(cols[0], '{:.0f}%')} | {span(cols[1], '{:.2f}')} | "
                  f"{span(cols[2], '{:.1f}')} | {span(cols[3], '{}%')} | {span(cols[4], '{:.2f}')} | {span(cols[5], '{:,}')} |")


if __name__ == "__main__":
    if sys.argv[1:] == ["--ranges"]:
        ranges({"P": ["P-0", "P-1", "P-2", "P-3", "P-4"], "V3": ["V3-2", "V3-3"], "V1": ["V1-0"], "V2": ["V2-1"],
                "V4": ["V4-4"]})
    else:
        sittings(sys.argv[1:])
