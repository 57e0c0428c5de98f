"""What cosched's default path costs the host, against an earlier commit, in one run.

    python -m benchmarks.cost [--baseline REV] [--guests 4] [--workload barrier]
        [--modes cfs,gang,auto] [--reps 3] [--seconds 20] [--settle 12] [--out DIR]
    python -m benchmarks.cost --report DIR

Real 2-vCPU TCG guests running one workload (``--workload``: the spin
barrier by default) are booted once.
Each repetition runs a daemon of this checkout and one of ``--baseline``
(a git worktree of that commit, with this checkout's built meter), one
after the other, the order swapped every repetition (this host drifts
from minute to minute); each daemon puts every guest under each mode in
turn (``cfs``: observed only, every guest under ``none``), waits
``--settle`` seconds (``auto`` also the suite's time to choose), and then
counts for ``--seconds``:

- the daemon's CPU time and its switcher's, apart, in percent of one CPU
  (``/proc``'s counts through psutil); ``total`` is their sum;
- the in-kernel meter's programs' run time, which the kernel counts while
  the benchmark runs (``meter``; it runs in the scheduler, in whatever
  thread switched, and is not in the daemon's time);
- the daemon's mean sampling period (its samples over the interval: its
  CPU budget stretches it), and its switch latency (p50, p99);
- each guest's progress, from its own live counters (never from cosched),
  summed over the guests as iterations per second;
- under ``boost`` and ``relaxed``, how soon long waits were boosted, from
  the kernel's trace (the suite's episodes: of the waits beside a running
  sibling that lasted over 1 ms or were boosted within it, the share
  boosted within 1 ms of their start, and the median time to that boost),
  and the boosts the daemon made.

Figures are medians over the repetitions, with their ranges. Output
(default ``benchmarks/results/<date>-<commit>-cost``): ``results.json``
and ``summary.md``; ``--report DIR`` redraws the summary.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

from benchmarks import as_root, commit, output_options, redrawn, written
from benchmarks.suite import (AUTO_SETTLE, SKEW_WINDOW, WORKLOADS, apply_mode, boot_set, in_turn, live_counters,
                              mode_policy, proc_states, quantile, scrape, silent_states, truth_figures, v2_cgroup)
from benchmarks.trace import SchedTrace
from cosched.sampler.meter import programs_run_time, run_time_stats
from testbed import guests, image, services
from testbed.daemon import DaemonProcess

LATENCY = "cosched_switch_latency_seconds_bucket"
PREFIX = "cosched-bench-"       # the suite's guests' prefix: boot_set names them
METER = "cosched/sampler/meter.bpf.o"


def progress(gs: list[guests.Guest]) -> dict:
    """Each guest's iterations so far and the time of the read."""
    return {name: (t, c["iters"]) for name, (t, c) in live_counters(gs).items()}


WATCHED = ("boost", "relaxed")


def measure(daemon: DaemonProcess, gs: list[guests.Guest], mode: str, seconds: float) -> dict:
    """The daemon's and its switcher's CPU, the meter's programs' run time in
    the kernel (where it observes through the meter), the daemon's mean
    sampling period, and the guests' progress, over ``seconds``; under a
    watched mode also the boosts' reaction from a trace."""
    status = daemon.status()
    tids = {d["name"]: {v["tid"] for v in d["vcpus"]} for d in status["domains"] if d["name"] in {g.name for g in gs}}
    pids = {v["tid"]: d["pid"] for d in status["domains"] if d["name"] in tids for v in d["vcpus"]}
    tracing = mode in WATCHED
    cgroups = {tid: v2_cgroup(pid, tid) for tid, pid in pids.items()} if tracing else {}
    with run_time_stats(), (SchedTrace(set(pids), cgroups, calls=True) if tracing else nullcontext()) as tracer:
        if tracer:
            time.sleep(0.5)                   # events before t0 give each thread's state at t0
        h0 = scrape(daemon)["hist"].get(LATENCY, [])
        a, m0 = daemon.status(), programs_run_time(daemon.proc.pid)
        (d0, s0), g0, t0, p0 = daemon.cpu_split(), progress(gs), time.monotonic(), proc_states(pids)
        time.sleep(seconds)
        (d1, s1), g1, t1, p1 = daemon.cpu_split(), progress(gs), time.monotonic(), proc_states(pids)
        end, m1 = daemon.status(), programs_run_time(daemon.proc.pid)
        h1 = scrape(daemon)["hist"].get(LATENCY, [])
    span = t1 - t0
    reaction = None
    if tracer:
        eps = [truth_figures(tracer.events, ts, t0, t1, silent_states(p0, p1, span), SKEW_WINDOW,
                             tracer.calls)["episodes"] for ts in tids.values()]
        due = sum(e["due"] for e in eps)
        reaction = {"due": due, "overruns": tracer.overruns,
                    "in_time": sum(e["due"] * (e["due_in_time"] or 0) for e in eps) / due if due else None,
                    "p50_ms": [e["reaction_p50_ms"] for e in eps],
                    "boosts": boosts(end) - boosts(a),
                    "held": {k: v - a["daemon"]["engine"]["long_waits_held"].get(k, 0)
                             for k, v in end["daemon"]["engine"]["long_waits_held"].items()}}
    a = a["daemon"]
    switch = {f"switch_p{q}_ms": (None if v is None else 1000 * v)
              for q, v in ((50, quantile(0.5, h0, h1)), (99, quantile(0.99, h0, h1)))}
    b = end["daemon"]
    samples = b["samples"] - a["samples"]
    modes = {d["name"]: d.get("mode") for d in end["domains"]}
    return {"mode": mode, "seconds": span, "observation": b["observation"]["source"],
            "period_ms": 1000 * span / samples if samples else None,
            "daemon_pct": 100 * (d1 - d0) / span, "switcher_pct": 100 * (s1 - s0) / span,
            "meter_pct": 100 * (m1[0] - m0[0]) / span,
            "total_pct": 100 * (d1 - d0 + s1 - s0) / span, **switch,
            "guest_rates": {n: (g1[n][1] - g0[n][1]) / (g1[n][0] - g0[n][0]) for n in g0},
            "modes": {g.name: modes.get(g.name) for g in gs}, "reaction": reaction}


def boosts(status: dict) -> int:
    return sum(v.get("boosts", 0) for d in status["domains"] if d["name"].startswith(PREFIX) for v in d["vcpus"])


def worktree(rev: str, where: Path) -> Path:
    """A checkout of ``rev`` at ``where`` with this checkout's meter object."""
    subprocess.run(["git", "worktree", "add", "--detach", str(where), rev], check=True, capture_output=True)
    if Path(METER).exists():
        shutil.copy(METER, where / METER)
    found = subprocess.run([sys.executable, "-c", "import cosched; print(cosched.__file__)"], cwd=where,
                           env={**os.environ, "PYTHONPATH": str(where)}, capture_output=True, text=True).stdout
    if not found.startswith(str(where)):
        raise RuntimeError(f"the baseline's daemon would run {found.strip()!r}, not {where}'s cosched")
    return where


def run_side(tree: Path | None, gs: list[guests.Guest], modes: list[str], args, rep: int) -> list[dict]:
    """One daemon (of ``tree``, or of this checkout) through every mode."""
    out = []
    with tempfile.TemporaryDirectory(prefix="cosched-cost-") as tmp:
        daemon = DaemonProcess(Path(tmp), cwd=tree).start()
        try:
            for mode in in_turn(modes, rep):
                apply_mode(daemon, gs, mode, args.settle)
                out.append(measure(daemon, gs, mode, args.seconds))
                r = out[-1]
                print(f"  {'baseline' if tree else 'this'} {mode}: daemon {r['daemon_pct']:.2f}% switcher "
                      f"{r['switcher_pct']:.2f}% total {r['total_pct']:.2f}%", flush=True)
        finally:
            daemon.stop()
    return out


def _rows(res: dict, runs: list[dict]):
    """(mode, commit, its runs) for each mode and commit that has runs, in the tables' order."""
    for mode in res["config"]["modes"]:
        for side, name in (("this", res["commit"]), ("baseline", res["config"]["baseline"])):
            rs = [r for r in runs if r["side"] == side and r["mode"] == mode]
            if rs:
                yield mode, name, rs


def _range(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})"


def summary(res: dict) -> str:
    c = res["config"]
    lines = ["# Cost of the default path", "",
             f"Host: {res['host']['cpus']} CPUs, kernel {res['host']['kernel']}, guests under TCG (no KVM).", "",
             f"Command: `{res['command']}`, at commit {res['commit']}, against {c['baseline']} in the same run.", "",
             f"{c['guests']} real 2-vCPU guests running the {c.get('workload', 'barrier')} workload; per repetition "
             f"and commit one "
             f"daemon puts them under each mode, settles {c['settle']:g} s (auto also {AUTO_SETTLE:g} s to choose) "
             f"and counts {c['seconds']:g} s. CPU in percent of one CPU, the daemon's and its switcher's apart; "
             f"guests' progress from their own counters, summed (iterations per second). Observed by "
             f"{', '.join(sorted({r['observation'] for r in res['runs']}))}. Medians over "
             f"{c['reps']} repetitions, ranges in brackets.", "",
             "| mode | commit | daemon % | switcher % | total % | meter % | sampling period ms | guests' progress /s |",
             "|---|---|---|---|---|---|---|---|"]
    for mode, name, rs in _rows(res, res["runs"]):
        lines.append(f"| {mode} | {name} | {_range([r['daemon_pct'] for r in rs])} | "
                     f"{_range([r['switcher_pct'] for r in rs])} | {_range([r['total_pct'] for r in rs])} | "
                     f"{_range([r['meter_pct'] for r in rs])} | {_range([r['period_ms'] or 0 for r in rs])} | "
                     f"{_range([sum(r['guest_rates'].values()) for r in rs]).replace('.00', '')} |")
    timed = [r for r in res["runs"] if r.get("switch_p99_ms") is not None]
    if timed:
        lines += ["", "Switch latency (first freeze write to last thaw), from the daemon's histogram, "
                  "interpolated within its buckets (0.1-0.25 ms wide below 1 ms):", "",
                  "| mode | commit | p50 ms | p99 ms |", "|---|---|---|---|"]
        for mode, name, rs in _rows(res, timed):
            lines.append(f"| {mode} | {name} | {_range([r['switch_p50_ms'] for r in rs])} | "
                         f"{_range([r['switch_p99_ms'] for r in rs])} |")
    reacted = [r for r in res["runs"] if r.get("reaction")]
    if reacted:
        lines += ["", "Long waits, from the kernel's trace: the waits beside a running sibling that lasted over "
                  "1 ms or were boosted within it (due), the share of them boosted within 1 ms of their start, "
                  "and the median time to that boost (the median over guests); from the daemon, the boosts it "
                  "made and the long waits it held back, by why:", "",
                  "| mode | commit | due | boosted within 1 ms | reaction p50 ms | boosts | held |",
                  "|---|---|---|---|---|---|---|"]
        for mode, name, rs in _rows(res, reacted):
            rx = [r["reaction"] for r in rs]
            held = {}
            for x in rx:
                for k, v in x["held"].items():
                    held[k] = held.get(k, 0) + v
            p50 = [statistics.median(ms) for x in rx if (ms := [m for m in x["p50_ms"] if m is not None])]
            lines.append(f"| {mode} | {name} | {_range([x['due'] for x in rx]).replace('.00', '')} | "
                         f"{_range([100 * (x['in_time'] or 0) for x in rx])}% | {_range(p50) if p50 else '–'} | "
                         f"{_range([x['boosts'] for x in rx]).replace('.00', '')} | "
                         f"{', '.join(f'{k} {v}' for k, v in sorted(held.items()) if v) or '–'} (all runs) |")
    chosen = sorted({json.dumps(r["modes"], sort_keys=True) for r in res["runs"] if r["mode"] == "auto"})
    if chosen:
        lines += ["", "What `auto` ran, per distinct choice seen at the end of a run: " +
                  "; ".join(", ".join(f"{n.removeprefix(PREFIX)} {m}" for n, m in json.loads(x).items()) for x in chosen) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default=None, help="the commit to measure against (none: this checkout only)")
    ap.add_argument("--guests", type=int, default=4)
    ap.add_argument("--workload", choices=WORKLOADS, default="barrier")
    ap.add_argument("--modes", type=lambda s: [m for m in s.split(",") if m], default=["cfs", "gang", "auto"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--settle", type=float, default=12.0)
    output_options(ap)
    args = ap.parse_args(argv)
    if redrawn(args, summary):
        return 0
    as_root(ap, "it starts libvirt guests and daemons")
    for m in args.modes:
        mode_policy(m)
    services.ensure()
    here = commit()
    base = None
    if args.baseline:
        base = subprocess.run(["git", "rev-parse", "--short", args.baseline], check=True, capture_output=True,
                              text=True).stdout.strip()
    res = {"host": {"cpus": len(os.sched_getaffinity(0)), "kernel": os.uname().release},
           "command": " ".join(["python -m benchmarks.cost", *sys.argv[1:]]), "commit": here,
           "config": {"baseline": base, "guests": args.guests, "workload": args.workload, "modes": args.modes,
                      "reps": args.reps,
                      "seconds": args.seconds, "settle": args.settle},
           "runs": []}
    out = args.out or Path("benchmarks/results") / f"{time.strftime('%Y-%m-%d')}-{here}-cost"
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="cosched-cost-base-"))
    tree = worktree(args.baseline, scratch / "tree") if args.baseline else None
    gs: list[guests.Guest] = []
    try:
        guests.destroy_all(PREFIX)
        boot_set([args.workload] * args.guests, 2, image.build(), gs)
        for rep in range(args.reps):
            sides = [("this", None), ("baseline", tree)] if tree else [("this", None)]
            for side, where in (sides if rep % 2 == 0 else sides[::-1]):
                print(f"repetition {rep + 1}/{args.reps}, {side}", flush=True)
                for r in run_side(where, gs, args.modes, args, rep):
                    res["runs"].append({"side": side, "rep": rep, **r})
                (out / "results.json").write_text(json.dumps(res, indent=1))
    finally:
        for g in gs:
            g.destroy()
        if tree:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
    written(out, res, summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
