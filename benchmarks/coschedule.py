"""Co-scheduling benchmark: the same guests under the host scheduler and each policy.

    python -m benchmarks.coschedule [--guests 3] [--vcpus 2] [--seconds 10] \\
        [--policies cfs,gang,partial,boost] [--out benchmarks/results/NAME]

One guest runs the spin-barrier workload alone first: its throughput is the
ideal (what the host can do for one synchronising guest). Then all guests run
together, first without co-scheduling (``cfs``: observed only) and then under
each policy, switched live with ``virsh metadata --live`` on the same booted
guests, with one daemon for the whole run. Per mode it records each guest's
barrier throughput (from its serial console), the aggregate as a fraction of
the ideal, Jain's fairness index, the daemon's switch latency p50/p99 and slot
lateness p99 (from its own histograms, interpolated within buckets as
Prometheus' ``histogram_quantile`` does), and the daemon's CPU time (daemon
and switcher processes) as a percentage of one CPU.

Writes ``results.json`` and ``summary.md`` to the output folder and prints
the table.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks.stats import jain, of_ideal
from testbed import guests, image, services
from testbed.daemon import DaemonProcess

PREFIX = "cosched-bench-"


def parse_histogram(text: str, name: str) -> list[tuple[float, float]]:
    """Cumulative ``(le, count)`` buckets of an unlabelled histogram in Prometheus text."""
    out = []
    for m in re.finditer(rf'^{name}_bucket{{le="([^"]+)"}} (\S+)$', text, re.M):
        out.append((float(m.group(1)), float(m.group(2))))
    return out


def quantile(q: float, before: list, after: list) -> float | None:
    """``histogram_quantile`` over the increase between two scrapes."""
    counts = [(le, a - b) for (le, a), (_, b) in zip(after, before)] if before else after
    if not counts or counts[-1][1] <= 0:
        return None
    rank = q * counts[-1][1]
    prev_le, prev_c = 0.0, 0.0
    for le, c in counts:
        if c >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_c) / max(c - prev_c, 1e-12)
        prev_le, prev_c = le, c
    return prev_le


def cpu_seconds(pid: int) -> float:
    p = psutil.Process(pid)
    total = sum(p.cpu_times()[:2])
    for c in p.children(recursive=True):
        try:
            total += sum(c.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return total


def set_policy(name: str, preset: str | None) -> None:
    xml = f'<policy name="{preset}"/>' if preset else '<policy name="none"/>'
    subprocess.run(["virsh", "-c", guests.URI, "metadata", name, "--uri", guests.NAMESPACE, "--key", "cosched",
                    "--set", xml, "--live"], check=True, capture_output=True)


def measure(daemon: DaemonProcess, gs, seconds: float) -> dict:
    since = {g.name: g.results()[-1]["t_ms"] for g in gs}
    m0, c0, t0 = daemon.metrics(), cpu_seconds(daemon.proc.pid), time.monotonic()
    time.sleep(seconds)
    m1, c1, t1 = daemon.metrics(), cpu_seconds(daemon.proc.pid), time.monotonic()
    tput = {g.name: guests.throughput(g.results(), since[g.name]) for g in gs}
    lat0, lat1 = (parse_histogram(m, "cosched_switch_latency_seconds") for m in (m0, m1))
    late0, late1 = (parse_histogram(m, "cosched_slot_lateness_seconds") for m in (m0, m1))
    return {
        "throughput": tput,
        "switch_latency_p50_ms": _ms(quantile(0.5, lat0, lat1)),
        "switch_latency_p99_ms": _ms(quantile(0.99, lat0, lat1)),
        "slot_lateness_p99_ms": _ms(quantile(0.99, late0, late1)),
        "switches": (lat1[-1][1] - (lat0[-1][1] if lat0 else 0)) if lat1 else 0,
        "daemon_cpu_pct": 100.0 * (c1 - c0) / (t1 - t0),
    }


def _ms(v):
    return None if v is None else round(v * 1000, 3)


def run(args) -> dict:
    img = image.build()
    services.ensure()
    guests.destroy_all(PREFIX)
    daemon = DaemonProcess(Path(tempfile.mkdtemp(prefix="cosched-bench-"))).start()
    names = [f"{PREFIX}{i}" for i in range(args.guests)]
    gs = []
    try:
        print(f"booting {names[0]} alone ...", flush=True)
        gs.append(guests.start(names[0], vcpus=args.vcpus, workload="barrier", image=img))
        gs[0].wait_for("cosched-result")
        time.sleep(1)
        alone = measure(daemon, gs, args.seconds)
        ideal = alone["throughput"][names[0]]
        print(f"  ideal: {ideal:.0f} iterations/s", flush=True)
        for name in names[1:]:
            gs.append(guests.start(name, vcpus=args.vcpus, workload="barrier", image=img))
        for g in gs:
            g.wait_for("cosched-result")
        modes = {}
        for mode in args.policies:
            for g in gs:
                set_policy(g.name, None if mode == "cfs" else mode)
            time.sleep(args.settle)
            print(f"measuring {mode} ...", flush=True)
            r = measure(daemon, gs, args.seconds)
            total = sum(r["throughput"].values())
            r.update(total=total, of_ideal=of_ideal(total, ideal), jain=jain(list(r["throughput"].values())),
                     shares={n: v / total if total else 0.0 for n, v in r["throughput"].items()})
            r["notes"] = [c["note"] for c in daemon.status()["daemon"]["engine"]["cells"] if c.get("note")]
            modes[mode] = r
            print(f"  {mode}: {100 * r['of_ideal']:.0f}% of ideal", flush=True)
    finally:
        daemon.stop()
        guests.destroy_all(PREFIX)
    return {
        "host": {"cpus": len(os.sched_getaffinity(0)), "kernel": platform.release(),
                 "domain_type": guests.domain_type(), "python": platform.python_version()},
        "config": {"guests": args.guests, "vcpus": args.vcpus, "seconds": args.seconds, "workload": "barrier"},
        "ideal": ideal, "alone": alone, "modes": modes,
        "command": f"python -m benchmarks.coschedule --guests {args.guests} --vcpus {args.vcpus} "
                   f"--seconds {args.seconds:g} --policies {','.join(args.policies)}",
    }


def summary(res: dict) -> str:
    h = res["host"]
    lines = [
        f"Host: {h['cpus']} CPUs, kernel {h['kernel']}, guests as domain type `{h['domain_type']}`; "
        f"{res['config']['guests']} guests x {res['config']['vcpus']} vCPUs, barrier workload, "
        f"{res['config']['seconds']:g} s per mode. Ideal (one guest alone): {res['ideal']:.0f} iterations/s.",
        "",
        f"Command: `{res['command']}`",
        "",
        "| mode | of ideal | per-guest share | Jain | switch p50 ms | switch p99 ms | lateness p99 ms | daemon CPU % |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode, r in res["modes"].items():
        shares = " / ".join(f"{100 * s:.0f}%" for s in r["shares"].values())
        fmt = lambda v: "-" if v is None else f"{v:.3f}"
        lines.append(f"| {mode} | {100 * r['of_ideal']:.0f}% | {shares} | {r['jain']:.2f} | {fmt(r['switch_latency_p50_ms'])} | "
                     f"{fmt(r['switch_latency_p99_ms'])} | {fmt(r['slot_lateness_p99_ms'])} | {r['daemon_cpu_pct']:.1f} |")
    notes = sorted({n for r in res["modes"].values() for n in r["notes"]})
    if notes:
        lines += ["", "Notes from the daemon:"] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--guests", type=int, default=3)
    ap.add_argument("--vcpus", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=10.0, help="measurement per mode")
    ap.add_argument("--settle", type=float, default=3.0, help="wait after a policy change")
    ap.add_argument("--policies", type=lambda s: s.split(","), default=["cfs", "gang", "partial", "boost"])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    res = run(args)
    out = args.out or Path("benchmarks/results") / time.strftime("coschedule-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=2))
    text = summary(res)
    (out / "summary.md").write_text(text)
    print("\n" + text + f"\nwritten to {out}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
