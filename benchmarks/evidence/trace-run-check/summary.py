"""Per sitting (``before/``, ``after/``): how far each vCPU thread's run time
in the trace, and in cosched's counters, is from the kernel's own account
(schedstat), and how far cosched's hazard is from the trace's; in points of
the interval. Then the same per thread over ``sweep/results.json`` (a suite
run), signed: above the kernel's is positive.

    python benchmarks/evidence/trace-run-check/summary.py
"""
from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    for sitting in ("before", "after"):
        rows = json.loads((HERE / sitting / "runs.json").read_text())
        gs = [f for r in rows for f in r["guests"].values()]
        trace = [abs(f["trace_run"][t] - k) for f in gs for t, k in f["kernel_run"].items()]
        ours = [abs(f["cosched_run"][t] - k) for f in gs for t, k in f["kernel_run"].items()]
        hazard = [abs(f["hazard"] - f["trace_hazard"]) for f in gs]
        print(f"{sitting}: {len(rows)} runs ({sum(r['valid'] for r in rows)} valid, "
              f"{sum(r['overruns'] for r in rows)} trace events lost), {len(gs)} guests, {len(trace)} threads")
        print(f"  trace run vs kernel: mean {sum(trace) / len(trace):.2f}, worst {max(trace):.2f}, "
              f"over 2 points: {sum(o > 2 for o in trace)}")
        print(f"  cosched run vs kernel: mean {sum(ours) / len(ours):.2f}, worst {max(ours):.2f}")
        print(f"  hazard, cosched vs trace: mean {sum(hazard) / len(hazard):.2f}, worst {max(hazard):.2f}, "
              f"over 1.5 points: {sum(h > 1.5 for h in hazard)}")
    sweep()


def sweep() -> None:
    res = json.loads((HERE / "sweep" / "results.json").read_text())
    ws = [w for r in res["runs"] if r["valid"] for w in r["per_guest"].values() if w.get("trace")]
    pairs = {"trace": [], "cosched": []}
    for w in ws:
        for tid, k in w["trace"]["run_kernel"].items():
            pairs["trace"].append(100 * (w["trace"]["run"][tid] - k))
            pairs["cosched"].append(100 * (w["vcpus"][tid]["run"] - k))
    print(f"sweep: {sum(r['valid'] for r in res['runs'])} valid runs of {len(res['runs'])}, "
          f"{len(ws)} traced guests, {len(pairs['trace'])} threads")
    for name, d in pairs.items():
        print(f"  {name} run minus kernel: mean {sum(d) / len(d):+.2f}, from {min(d):+.2f} to {max(d):+.2f}")


if __name__ == "__main__":
    main()
