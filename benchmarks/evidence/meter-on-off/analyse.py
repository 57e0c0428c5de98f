"""Meter off against meter on, in alternated sittings of the same code.

    python benchmarks/evidence/meter-on-off/analyse.py

Prints, per workload, guest count and mode: the throughput of the ideal
(as the suite's first table) in each sitting, and the aggregate
iterations per second of all guests (``alone``: the ideal's own run of
the repetition it leads); then the daemon's CPU and, under ``boost``,
the share of waits due a boost boosted within 1 ms and the median time
to that boost.
"""
import json
import sys
from pathlib import Path
from statistics import mean

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
from benchmarks.report import aggregate  # noqa: E402

SITTINGS = ("off1", "auto1", "off2")


def ratio(v: dict) -> str:
    off = [v[s] for s in v if s.startswith("off")]
    on = [v[s] for s in v if s.startswith("auto")]
    return f"{mean(on) / mean(off):.2f}" if on and off else "-"


def table(head: list[str], rows: list[list[str]]) -> None:
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print()


def main() -> None:
    results = {s: json.loads((HERE / s / "results.json").read_text()) for s in SITTINGS}
    aggs = {s: aggregate(r) for s, r in results.items()}
    keys = sorted({k for a in aggs.values() for k in a if k[2] != "alone"})
    rows = []
    for k in keys:
        v = {s: mean(a[k]["of_ideal"]) for s, a in aggs.items() if k in a and a[k]["of_ideal"]}
        rows.append([k[0], str(k[1]), k[2], *(f"{100 * v[s]:.0f}%" if s in v else "-" for s in SITTINGS), ratio(v)])
    table(["workload", "guests", "mode", *SITTINGS, "on / off"], rows)

    rates: dict[tuple, dict] = {}
    for s, res in results.items():
        runs = res["runs"]
        for i, r in enumerate(runs):
            if not r.get("valid", True):
                continue
            n = r["guests"] if r["mode"] != "alone" else runs[i + 1]["guests"]
            rates.setdefault((r["workload"], n, r["mode"]), {})[s] = sum(g["rate"] for g in r["per_guest"].values())
    table(["workload", "guests", "mode", *(f"{s} iterations/s" for s in SITTINGS), "on / off"],
          [[*map(str, k), *(f"{v[s]:.0f}" if s in v else "-" for s in SITTINGS), ratio(v)]
           for k, v in sorted(rates.items())])

    rows = []
    for k in keys:
        cells = []
        for s in SITTINGS:
            x = aggs[s].get(k)
            e = (x or {}).get("episodes") or {}
            reacted = k[2] == "boost" and e.get("in_time") is not None and e.get("reaction_p50_ms") is not None
            cells.append(f"{x['cpu_pct']:.1f}%" + (f" / {100 * e['in_time']:.0f}% / {e['reaction_p50_ms']:.2f} ms"
                                                   if reacted else "") if x else "-")
        rows.append([k[0], str(k[1]), k[2], *cells])
    table(["workload", "guests", "mode", *(f"{s}: daemon CPU / boosted within 1 ms / p50" for s in SITTINGS)], rows)


if __name__ == "__main__":
    main()
