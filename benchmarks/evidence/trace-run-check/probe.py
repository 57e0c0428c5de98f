"""GUESTS guests of WORKLOAD under the host scheduler (``cfs``), measured
REPS times in a row with the benchmark suite's own steps (``apply_mode``,
``measure`` with the trace on): per guest, cosched's hazard and per-vCPU
run and wait, the trace's, and each thread's run time as the kernel bills
it (schedstat at both ends). A run whose trace gives some thread a run time
more than 2 points of the interval away from the kernel's keeps its raw
trace (``trace-REP.txt.gz``) beside the figures.

    python benchmarks/evidence/trace-run-check/probe.py WORKLOAD GUESTS REPS OUTDIR
"""
from __future__ import annotations

import gzip
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks import suite                           # noqa: E402
from testbed import guests, image                      # noqa: E402
from testbed.daemon import DaemonProcess              # noqa: E402

OFF_PP = 2.0


class KeptTrace(suite.SchedTrace):
    """The suite's trace, keeping the last one's raw text."""
    last = ""

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        KeptTrace.last = self.text


def figures(w: dict) -> dict:
    t = w["trace"]
    pct = lambda d: {str(k): round(100 * v, 2) for k, v in d.items()}     # noqa: E731
    return {"hazard": round(100 * w["hazard"], 2), "trace_hazard": round(100 * t["hazard"], 2),
            "together": round(100 * t["together"], 2),
            "cosched_run": {str(k): round(100 * v["run"], 2) for k, v in w["vcpus"].items()},
            "cosched_wait": {str(k): round(100 * v["wait"], 2) for k, v in w["vcpus"].items()},
            "trace_run": pct(t["run"]), "trace_wait": pct(t["wait"]), "kernel_run": pct(t["run_kernel"]),
            "reconstructed": round(100 * t["reconstructed"], 2)}


def main() -> None:
    workload, n, reps, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    out.mkdir(parents=True, exist_ok=True)
    suite.SchedTrace = KeptTrace
    img = image.build()
    daemon = DaemonProcess(Path(tempfile.mkdtemp(prefix="cosched-probe-"))).start()
    rows = []
    try:
        gs = suite.boot_set([workload] * n, 2, img)
        daemon.wait(lambda: all(daemon.domain(g.name) for g in gs), 10, "guests observed")
        suite.apply_mode(daemon, gs, "cfs", 1.5)
        for rep in range(reps):
            r = suite.measure(daemon, gs, "cfs", 5.0, True)
            row = {"rep": rep, "valid": r["valid"], "overruns": r["trace_overruns"], "interval": r.get("interval"),
                   "guests": {g: figures(w) for g, w in r["per_guest"].items()}}
            off = [(g, tid, f["trace_run"][tid], f["kernel_run"][tid]) for g, f in row["guests"].items()
                   for tid in f["kernel_run"] if abs(f["trace_run"][tid] - f["kernel_run"][tid]) > OFF_PP]
            row["trace_off"] = off
            if off:
                (out / f"trace-{rep}.txt.gz").write_bytes(gzip.compress(KeptTrace.last.encode()))
            rows.append(row)
            worst = max((abs(f["hazard"] - f["trace_hazard"]) for f in row["guests"].values()), default=None)
            print(rep, r["valid"], "worst hazard pp", worst, "trace off", off, file=sys.stderr, flush=True)
            (out / "runs.json").write_text(json.dumps(rows, indent=1) + "\n")
    finally:
        try:
            guests.destroy_all(suite.PREFIX)
        finally:
            daemon.stop()


if __name__ == "__main__":
    main()
