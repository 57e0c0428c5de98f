"""How cosched's costs grow with the number of vCPUs and guests.

    python -m benchmarks.scale [--vcpus 8,64,256,1024] [--per-guest 8] [--seconds 20]
        [--observe proc,meter] [--sizes 1,2,8,32,64] [--cells 16] [--libvirt-guests 100] [--out DIR]

Synthetic guests (:mod:`testbed.synthetic`: processes that look like QEMU
guests to discovery, their threads in libvirt's cgroup layout) stand in for
real ones, so that a thousand vCPUs fit on a 2-CPU host. Three parts, each
measured on this host and reported with its command:

**Observation** (``--vcpus``): for each total, that many vCPU threads in
guests of ``--per-guest`` vCPUs (their threads mostly asleep, as most vCPUs
are), watched by a real daemon (``sources = ["processes"]``, every guest
under ``none``), once sampling ``/proc`` (``meter = "off"``) and once with
the in-kernel meter (``--observe``), for ``--seconds``, from 30 s after it showed every vCPU
(once its averages have settled). Figures: the daemon's CPU time (with its
children) in percent of one CPU; that over the samples taken and the vCPUs,
the cost of one vCPU-sample in microseconds; late samples; the last resync's
duration; one ``/metrics`` scrape (median of 5) and its size; the daemon's
resident memory. The threads compute ~20 µs and sleep 50 ms: an idle vCPU
woken by a 20 Hz tick (at 1 ms, a thousand of them swamp 2 CPUs with wake-ups).

**Switching** (``--sizes``, ``--cells``): the switch loop's own figures,
from the real switcher process fed one plan, as the daemon feeds it: two
guests of each size taking 50 ms turns, their threads asleep (a thread
freezes as soon as it is told: the switcher's own cost) and then spinning
(a running thread freezes when it next enters the kernel, and here 2 CPUs
serve all of one guest's spinning threads: from 8 vCPUs a guest on, that
is the host's oversubscription, not the switcher), and
``--cells`` cells of two 2-vCPU guests each (their threads asleep: spinning,
sixteen cells' running vCPUs would oversubscribe 2 CPUs sixteen times, and
each freeze would wait for its thread to get a CPU). The planner would not admit
guests larger than this host's 2 CPUs, nor 16 cells on it, so the plan is
the one it makes on a host big enough; the switcher does not look at CPUs.
Figures: switch latency (first freeze write until every incoming vCPU is
thawed) p50/p99 and slot lateness p99, from the switcher's exact
nanosecond samples, and the kernel's part of it at the largest size: one
``cgroup.freeze`` write and one thaw write, timed alone.

**Real guests** (``--libvirt-guests``, 0 to skip): that many tiny TCG
guests, each paused once booted, and a daemon started on them: the time
until its status shows every one with its vCPUs, and after ``libvirtd`` is
killed and started again, the time until it is connected and shows them all.

Output (default ``benchmarks/results/scale-<time>``): ``results.json`` and
``summary.md``; ``python -m benchmarks.scale --report DIR`` redraws the summary.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

from benchmarks import as_root, commit, output_options, redrawn, written
from cosched.config import Config
from cosched.policy.plan import Cell, Member, PlannedVcpu
from cosched.switcher import protocol as pr
from cosched.sampler.meter import programs_run_time, run_time_stats
from testbed import guests, image, services, synthetic
from testbed.daemon import DaemonProcess

PREFIX = "cosched-scale-"
WARMUP_S = 30.0           # the sampler averages the rest of the daemon's CPU over 10 s: settled by then
SLEEP_MS = 50             # an idle vCPU's wake-ups: a 20 Hz tick (a thousand at 1 ms would swamp 2 CPUs)
TARGETS = {"cpu_256": 2.0, "cpu_1024": 5.0, "switch_p99_64_ms": 1.0, "scrape_1024_ms": 100.0}


def _rss_mb(pid: int) -> float:
    p = psutil.Process(pid)
    return (p.memory_info().rss + sum(c.memory_info().rss for c in p.children(recursive=True))) / 2 ** 20


def _scrape(daemon: DaemonProcess) -> tuple[float, int]:
    times, size = [], 0
    for _ in range(5):
        t0 = time.perf_counter()
        with urllib.request.urlopen(f"http://127.0.0.1:{daemon.port}/metrics", timeout=30) as r:
            size = len(r.read())
        times.append(time.perf_counter() - t0)
    return statistics.median(times), size


def observation(total: int, per_guest: int, seconds: float, work: Path, budget: float | None = None,
                source: str = "proc") -> dict:
    """One daemon watching ``total`` synthetic vCPUs (``budget``: its
    ``sample_budget_pct``; ``source``: ``proc``, sampling ``/proc``, or
    ``meter``, the in-kernel meter, whose programs' own run time is counted
    too: it runs in the scheduler, not in the daemon)."""
    pve = work / f"pve-{total}"
    gs: list[synthetic.SyntheticGuest] = []
    try:
        for n in range(max(total // per_guest, 1)):
            gs.append(synthetic.start(f"{PREFIX}{total}-{n}", vcpus=min(per_guest, total), workload="sleep",
                                      sleep_ms=SLEEP_MS, vmid=10000 + n, pve_dir=str(pve), tags="cosched-none",
                                      workdir=work))
        vcpus = sum(g.vcpus for g in gs)
        (work / f"daemon-{total}-{source}").mkdir(exist_ok=True)
        daemon = DaemonProcess(work / f"daemon-{total}-{source}",
                               extra_config=f'sources = ["processes"]\npve_config_dir = "{pve}"\n'
                                            + synthetic.trust_config() + f'meter = "{"auto" if source == "meter" else "off"}"\n'
                                            + (f"sample_budget_pct = {budget}\n" if budget else "")).start(timeout=180)
        try:
            daemon.wait(lambda: sum(len(d["vcpus"]) for d in daemon.status()["domains"]) == vcpus, 60,
                        f"{vcpus} vCPUs observed")
            observed = daemon.status()["daemon"]["observation"]
            if observed["source"] != source:
                raise RuntimeError(f"the daemon observes with {observed['source']}, not {source}: {observed['why']}")
            time.sleep(WARMUP_S)                              # past start-up: the daemon's averages settled
            with run_time_stats() if source == "meter" else contextlib.nullcontext():
                s0, c0, t0 = daemon.status()["daemon"], daemon.cpu_seconds(), time.monotonic()
                m0 = programs_run_time(daemon.proc.pid)
                time.sleep(seconds)
                s1, c1, t1 = daemon.status()["daemon"], daemon.cpu_seconds(), time.monotonic()
                m1 = programs_run_time(daemon.proc.pid)
            scrape_s, size = _scrape(daemon)
            samples = s1["samples"] - s0["samples"]
            cpu = c1 - c0
            runs = m1[1] - m0[1]
            return {"vcpus": vcpus, "guests": len(gs), "source": source, "seconds": t1 - t0,
                    "cpu_pct": 100 * cpu / (t1 - t0),
                    "meter_cpu_pct": 100 * (m1[0] - m0[0]) / (t1 - t0), "meter_runs_per_s": runs / (t1 - t0),
                    "meter_ns_per_run": 1e9 * (m1[0] - m0[0]) / runs if runs else None,
                    "budget_pct": budget,
                    "period_ms": 1000 * (t1 - t0) / samples if samples else None,   # mean, over the same interval
                    "period_end_ms": s1.get("sample_period_ms"),
                    "samples": samples, "late_samples": s1["late_samples"] - s0["late_samples"],
                    "us_per_vcpu_sample": 1e6 * cpu / (samples * vcpus) if samples else None,
                    "resync_s": s1.get("last_resync_seconds"), "scrape_s": scrape_s, "metrics_bytes": size,
                    "rss_mb": _rss_mb(daemon.proc.pid)}
        finally:
            daemon.stop()
    finally:
        synthetic.destroy_all(gs)


def _member(g: synthetic.SyntheticGuest, slot_ms: int) -> Member:
    v2 = synthetic.cgroup_mounts()[0]
    base = synthetic.guest_cgroup(g.layout, g.vmid, g.name)
    return Member(g.uuid, g.name, slot_ms, 0, tuple(
        PlannedVcpu(i, tid, 0, -1, f"{v2}{base}/vcpu{i}/cgroup.freeze") for i, tid in sorted(g.tids.items())))


def run_switcher(cells: list[tuple[str, list[synthetic.SyntheticGuest]]], seconds: float) -> dict:
    """The real switcher process on one plan for ``seconds``: its exact latency and lateness samples."""
    plan = pr.Orders(seq=1, max_stall_ms=500, rt_top_us=None,
                   cells=tuple(Cell(cid, "freeze", (), tuple(_member(g, 50) for g in gs)) for cid, gs in cells))
    proc = subprocess.Popen([sys.executable, "-m", "cosched.switcher"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, bufsize=1)
    latency, lateness, switches, realtime = [], [], 0, None
    try:
        proc.stdin.write(pr.encode(plan))
        proc.stdin.flush()
        end = time.monotonic() + seconds
        for line in proc.stdout:
            msg = pr.decode(line)
            if isinstance(msg, pr.Ready):
                realtime = msg.realtime
            elif isinstance(msg, pr.Stats):
                latency += msg.latency_ns
                lateness += msg.lateness_ns
                switches += sum(msg.switches.values())
            if time.monotonic() > end:
                break
    finally:
        proc.stdin.write(pr.encode(pr.Stop()))
        proc.stdin.close()
        proc.wait(timeout=10)

    def q(xs, p):
        xs = sorted(xs)
        return xs[min(int(p * len(xs)), len(xs) - 1)] / 1e6 if xs else None
    return {"switches": switches, "realtime": realtime, "latency_p50_ms": q(latency, 0.5),
            "latency_p99_ms": q(latency, 0.99), "lateness_p50_ms": q(lateness, 0.5),
            "lateness_p99_ms": q(lateness, 0.99)}


def write_cost(gs: list[synthetic.SyntheticGuest], rounds: int = 100) -> dict:
    """The kernel's part of a slot change: ``cgroup.freeze`` writes through the
    switcher's own :class:`~cosched.actuators.freezer.Freezer`, timed apart
    from everything else. Each round freezes every vCPU cgroup of the guests,
    waits until they say frozen (untimed), and thaws them; the figures are
    the median time of one freeze write and of one thaw write."""
    from cosched.actuators.freezer import Freezer
    from cosched.hostfs import HostFS
    v2 = synthetic.cgroup_mounts()[0]
    files = [f"{v2}{synthetic.guest_cgroup(g.layout, g.vmid, g.name)}/vcpu{i}/cgroup.freeze" for g in gs for i in g.tids]
    freezer, per = Freezer(HostFS("/")), {True: [], False: []}
    try:
        for _ in range(rounds):
            for frozen in (True, False):
                t0 = time.perf_counter_ns()
                for f in files:
                    freezer.set(f, frozen)
                per[frozen].append((time.perf_counter_ns() - t0) / len(files))
                if frozen:
                    freezer.wait(files, True)
    finally:
        for f in files:
            freezer.set(f, False)
        freezer.close()
    return {"cgroups": len(files), "freeze_write_us": statistics.median(per[True]) / 1e3,
            "thaw_write_us": statistics.median(per[False]) / 1e3}


def switching(sizes: list[int], cells: int, seconds: float, work: Path) -> dict:
    out = {"sizes": [], "cells": None}
    for workload in ("sleep", "spin"):
        for k in sizes:
            gs = []
            try:
                for n in range(2):
                    gs.append(synthetic.start(f"{PREFIX}sw{k}-{n}", vcpus=k, workload=workload, sleep_ms=SLEEP_MS,
                                              vmid=20000 + 100 * k + n, workdir=work))
                out["sizes"].append({"vcpus_per_guest": k, "workload": workload,
                                     **run_switcher([("gang", gs)], seconds)})
                if workload == "sleep" and k == max(sizes):
                    out["writes"] = write_cost(gs)
            finally:
                synthetic.destroy_all(gs)
    if cells:
        gs = []
        try:
            for n in range(2 * cells):            # asleep: 16 cells' turns on 2 CPUs would be 16x oversubscribed
                gs.append(synthetic.start(f"{PREFIX}cell{n}", vcpus=2, workload="sleep", sleep_ms=SLEEP_MS,
                                          vmid=30000 + n, workdir=work))
            out["cells"] = {"cells": cells, **run_switcher([(f"cell{c}", gs[2 * c:2 * c + 2]) for c in range(cells)],
                                                           seconds)}
        finally:
            synthetic.destroy_all(gs)
    return out


def real_guests(count: int, work: Path) -> dict:
    """Discovery of ``count`` real, paused TCG guests: first snapshot, and resync after a libvirtd restart."""
    img = image.build()
    services.ensure()
    guests.destroy_all(PREFIX)
    started = []
    try:
        for n in range(count):
            g = guests.start(f"{PREFIX}vm{n}", vcpus=2, workload="idle", image=img)
            g.wait_for("cosched-result")
            g.dom.suspend()
            started.append(g)
        names = {g.name for g in started}

        def all_seen():
            s = daemon.status()
            return s and names <= {d["name"] for d in s["domains"] if len(d["vcpus"]) == 2}
        (work / "daemon-real").mkdir(exist_ok=True)
        daemon = DaemonProcess(work / "daemon-real")
        t0 = time.monotonic()
        daemon.start()
        try:
            daemon.wait(all_seen, 120, f"{count} guests")
            first = time.monotonic() - t0
            resync = daemon.status()["daemon"].get("last_resync_seconds")
            services.stop("libvirtd")
            daemon.wait(lambda: not daemon.status()["daemon"]["libvirt"]["connected"], 30, "libvirtd gone")
            services.ensure()
            t1 = time.monotonic()
            daemon.wait(lambda: daemon.status()["daemon"]["libvirt"]["connected"] and all_seen(), 60, "back")
            after = time.monotonic() - t1
        finally:
            daemon.stop()
        return {"guests": count, "first_snapshot_s": first, "resync_s": resync, "after_libvirtd_restart_s": after}
    finally:
        guests.destroy_all(PREFIX)


def _period(o: dict) -> str:
    return "-" if o.get("period_ms") is None else f"{o['period_ms']:.0f}"


def summary(res: dict) -> str:
    lines = ["# Scale benchmark", "", f"Host: {res['host']['cpus']} CPUs, kernel {res['host']['kernel']}.", "",
             f"Command: `{res['command']}`" + (f", at commit {res['commit']}." if res.get("commit") else ""), "",
             "## Observation", "",
             f"One daemon watching synthetic guests of {res['config']['per_guest']} vCPUs (threads asleep but for "
             f"~20 µs every {SLEEP_MS} ms), sample_budget_pct {res['config'].get('sample_budget_pct') or '2 (the default then)'}, "
             f"every guest under `none`, for {res['config']['seconds']:g} s"
             + (f" from {res['config']['warmup_s']:g} s after it showed every vCPU." if "warmup_s" in res["config"]
                else "."), "",
             "Observed by `proc` (the sampler reading `/proc`) or `meter` (the in-kernel meter; its "
             "programs run in the scheduler, not in the daemon, so their run time is counted apart, from the "
             "kernel's BPF statistics, and added in `total`).", "",
             "| vCPUs | guests | observed by | daemon CPU % | meter CPU % (runs/s, ns per run) | total CPU % | mean sampling period ms | µs per vCPU-sample | samples/s | late | resync ms | scrape ms | /metrics KiB | RSS MiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for o in res["observation"]:
        meter = (f"{o['meter_cpu_pct']:.2f} ({o['meter_runs_per_s']:.0f}, {o['meter_ns_per_run'] or 0:.0f})"
                 if o.get("source") == "meter" else "-")
        lines.append(f"| {o['vcpus']} | {o['guests']} | {o.get('source', 'proc')} | {o['cpu_pct']:.1f} | {meter} | "
                     f"{_total(o):.1f} | {_period(o)} | "
                     f"{o['us_per_vcpu_sample']:.1f} | {o['samples'] / o['seconds']:.0f} | {o['late_samples']} | "
                     f"{1000 * (o['resync_s'] or 0):.0f} | {1000 * o['scrape_s']:.0f} | "
                     f"{o['metrics_bytes'] / 1024:.0f} | {o['rss_mb']:.0f} |")
    sw = res.get("switching") or {}
    if sw.get("sizes"):
        lines += ["", "## Switching", "",
                  "The real switcher process on one plan: two guests taking 50 ms turns (exact nanosecond "
                  "samples, not histogram buckets). Asleep, a vCPU thread freezes as soon as it is told, so the "
                  "latency is the switcher's own; spinning, it freezes when it next enters the kernel, and on "
                  "this 2-CPU host that waits for a CPU behind the guest's other spinning threads.", "",
                  "| vCPUs per guest | threads | switches | latency p50 ms | latency p99 ms | lateness p99 ms |",
                  "|---|---|---|---|---|---|"]
        for s in sw["sizes"]:
            lines.append(f"| {s['vcpus_per_guest']} | {s.get('workload', 'spin')} | {s['switches']} | "
                         f"{s['latency_p50_ms']:.2f} | {s['latency_p99_ms']:.2f} | {s['lateness_p99_ms']:.2f} |")
    if sw.get("writes"):
        w = sw["writes"]
        lines += ["", f"The kernel's part, timed alone on the {w['cgroups']} vCPU cgroups of the largest pair "
                      f"(threads asleep; median of 100 rounds): a freeze write {w['freeze_write_us']:.1f} µs, a thaw "
                      f"write {w['thaw_write_us']:.1f} µs per cgroup, so one guest of "
                      f"{w['cgroups'] // 2} vCPUs costs {w['cgroups'] // 2 * (w['freeze_write_us'] + w['thaw_write_us']) / 1e3:.2f} "
                      "ms of writes per slot change before any waiting."]
    if sw.get("cells"):
        c = sw["cells"]
        lines += ["", f"{c['cells']} cells of two 2-vCPU guests each (threads asleep): {c['switches']} switches, latency p50 "
                      f"{c['latency_p50_ms']:.2f} ms, p99 {c['latency_p99_ms']:.2f} ms; slot lateness p50 "
                      f"{c['lateness_p50_ms']:.2f} ms, p99 {c['lateness_p99_ms']:.2f} ms."]
    r = res.get("real")
    if r:
        lines += ["", "## Real guests", "",
                  f"{r['guests']} paused TCG guests: first full snapshot {r['first_snapshot_s']:.1f} s after the "
                  f"daemon started (one resync {1000 * (r['resync_s'] or 0):.0f} ms); after libvirtd was killed "
                  f"and started again, connected with all guests {r['after_libvirtd_restart_s']:.1f} s after it "
                  f"answered."]
    lines += ["", "## Targets", ""]
    checks = []
    for n, key in ((256, "cpu_256"), (1024, "cpu_1024")):
        for o in (o for o in res["observation"] if o["vcpus"] == n):
            checks.append(f"{n} vCPUs observed ({o.get('source', 'proc')}) for at most {TARGETS[key]:g}% of one CPU: "
                          f"{_total(o):.1f}% ({'met' if _total(o) <= TARGETS[key] else 'not met'})")
    obs = {o["vcpus"]: o for o in res["observation"]}
    for big in (s for s in (sw.get("sizes") or []) if s["vcpus_per_guest"] == 64):
        checks.append(f"switch p99 at most 1 ms at 64 vCPUs per guest, threads {big.get('workload', 'spin')}: "
                      f"{big['latency_p99_ms']:.2f} ms ({'met' if big['latency_p99_ms'] <= 1.0 else 'not met'})")
    if 1024 in obs:
        ms = 1000 * obs[1024]["scrape_s"]
        checks.append(f"/metrics scraped in under 100 ms at 1024 vCPUs: {ms:.0f} ms ({'met' if ms < 100 else 'not met'})")
    lines += [f"- {c}" for c in checks]
    return "\n".join(lines) + "\n"


def _total(o: dict) -> float:
    """The daemon's CPU and, observed by the meter, its programs' run time."""
    return o["cpu_pct"] + (o.get("meter_cpu_pct") or 0.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ints = lambda s: [int(x) for x in s.split(",") if x]
    ap.add_argument("--vcpus", type=ints, default=[8, 64, 256, 1024])
    ap.add_argument("--per-guest", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--sizes", type=ints, default=[1, 2, 8, 32, 64])
    ap.add_argument("--cells", type=int, default=16)
    ap.add_argument("--libvirt-guests", type=int, default=100)
    ap.add_argument("--sample-budget", type=float, default=None, help="the daemon's sample_budget_pct (default: its own)")
    ap.add_argument("--observe", type=lambda t: [x for x in t.split(",") if x], default=["proc", "meter"],
                    help="observe each count with the sampler (proc), the in-kernel meter (meter), or both")
    output_options(ap)
    args = ap.parse_args(argv)
    if redrawn(args, summary):
        return 0
    as_root(ap, "it makes cgroups, starts a daemon and guests")
    services.ensure()
    work = Path(tempfile.mkdtemp(prefix="cosched-scale-"))
    res = {"host": {"cpus": len(os.sched_getaffinity(0)), "kernel": os.uname().release},
           "command": " ".join(["python -m benchmarks.scale", *sys.argv[1:]]),
           "commit": commit(),
           "config": {"vcpus": args.vcpus, "per_guest": args.per_guest, "seconds": args.seconds,
                      "sizes": args.sizes, "cells": args.cells, "libvirt_guests": args.libvirt_guests,
                      "sample_budget_pct": args.sample_budget or Config().sample_budget_pct, "warmup_s": WARMUP_S, "observe": args.observe},
           "observation": [], "switching": None, "real": None}
    for n in args.vcpus:
        for source in args.observe:
            res["observation"].append(observation(n, args.per_guest, args.seconds, work, args.sample_budget, source))
            print(f"observation {n} vCPUs by {source}: {_total(res['observation'][-1]):.1f}% of a CPU", flush=True)
    res["switching"] = switching(args.sizes, args.cells, args.seconds, work)
    print("switching done", flush=True)
    if args.libvirt_guests:
        res["real"] = real_guests(args.libvirt_guests, work)
    written(args.out or Path("benchmarks/results") / time.strftime("scale-%Y%m%d-%H%M%S"), res, summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
