"""Long waits of runnable vCPUs under the host scheduler, and what ran instead.

    python -m benchmarks.starvation [--guests 2] [--rounds 8] [--seconds 8] [--flat] [--out DIR]

The ``cfs`` baseline of the suite rests on what the host scheduler does with
guests left alone, so this measures it without cosched: GUESTS two-vCPU
``barrier`` guests boot (no daemon runs), and in each of ROUNDS intervals of
SECONDS the kernel's scheduler events of their vCPU threads are recorded
(:mod:`benchmarks.trace`). Every wait of a runnable vCPU longer than
``--min-ms`` (150) is listed: which vCPU, how long, on which CPU, and what ran
on that CPU meanwhile (from the trace's switches), with each vCPU thread's
affinity, policy, nice, cgroups and the ``cpu.shares`` of each of its cpu
cgroups at the end of the round.

``--flat`` first moves every vCPU thread into one cpu-controller cgroup of
its own (``<cpu mount>/cosched-starvation``, v1 cpu controller; removed at
the end), out of libvirt's per-domain and per-vCPU groups, so that the two
runs tell whether the group hierarchy is what starves a vCPU.

Output: the waits on stdout and ``results.json`` in DIR (default
``benchmarks/results/starvation-<time>``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from benchmarks.suite import host_state
from benchmarks.trace import SchedTrace, switches
from testbed import guests, image, services

PREFIX = "cosched-starve-"
FLAT = "cosched-starvation"


def waits(events, longer_than: float) -> list[tuple[float, float, int]]:
    """``(begin, end, tid)`` of every runnable-but-waiting stretch longer than
    ``longer_than`` seconds: from a preemption or wake-up to the next switch-in."""
    since: dict[int, float] = {}
    out = []
    for e in sorted(events, key=lambda e: e.t):
        if e.kind in ("out-runnable", "wakeup"):
            since.setdefault(e.tid, e.t)
        elif e.kind == "in" and e.tid in since:
            begin = since.pop(e.tid)
            if e.t - begin > longer_than:
                out.append((begin, e.t, e.tid))
        elif e.kind == "out-sleep":
            since.pop(e.tid, None)
    return out


def occupancy(sw: list[tuple], cpu: int, begin: float, end: float) -> dict[str, float]:
    """Seconds each task ran on ``cpu`` within ``[begin, end]``, by ``comm(pid)``,
    from the trace's switches (who was switched in, until the next switch there)."""
    on = [s for s in sw if s[1] == cpu]
    out: dict[str, float] = {}
    for i, (t, _, _, _, nxt, comm) in enumerate(on):
        t_next = on[i + 1][0] if i + 1 < len(on) else end
        lo, hi = max(t, begin), min(t_next, end)
        if hi > lo:
            key = f"{comm}({nxt})"
            out[key] = out.get(key, 0.0) + hi - lo
    return out


def shares(tid: int) -> dict[str, str]:
    """``cpu.shares`` of every cpu-controller (v1) cgroup from the root down
    to the thread's own: the weights group scheduling divides a CPU by."""
    cpu_mount = guests.cgroup_mounts()[1]
    out = {}
    for line in Path(f"/proc/{tid}/cgroup").read_text().split():
        _, ctrls, path = line.split(":", 2)
        if cpu_mount and "cpu" in ctrls.split(","):
            parts = [p for p in path.split("/") if p]
            for k in range(len(parts) + 1):
                level = "/" + "/".join(parts[:k])
                try:
                    out[level] = (Path(cpu_mount) / level.lstrip("/") / "cpu.shares").read_text().strip()
                except OSError:
                    pass
    return out


def flatten(tids: list[int]) -> Path:
    cpu_mount = guests.cgroup_mounts()[1]
    if cpu_mount is None:
        raise SystemExit("--flat needs the v1 cpu controller (this host has none)")
    flat = Path(cpu_mount) / FLAT
    flat.mkdir(exist_ok=True)
    for tid in tids:
        (flat / "tasks").write_text(str(tid))
    return flat


def run(args) -> dict:
    img = image.build()
    services.ensure()
    guests.destroy_all(PREFIX)
    gs = [guests.start(f"{PREFIX}{i}", vcpus=2, workload="barrier interval_ms=100", image=img,
                       policy=guests.annotation("none")) for i in range(args.guests)]
    flat = None
    try:
        for g in gs:
            g.wait_for("cosched-result")
        names, pids = {}, {}
        for g in gs:
            pid = guests.qemu_pid(g.name)
            for tid, v in guests.vcpu_threads(g.name).items():
                names[tid] = f"{g.name[len(PREFIX):]}.vcpu{v}"
                pids[tid] = pid
        if args.flat:
            flat = flatten(sorted(names))
        rounds = []
        for r in range(args.rounds):
            time.sleep(args.gap)
            with SchedTrace(set(names)) as tr:
                time.sleep(args.seconds)
            sw = list(switches(tr.text))
            found = []
            for begin, end, tid in waits(tr.events, args.min_ms / 1000):
                outs = [s for s in sw if s[2] == tid and s[0] <= begin + 1e-6]
                cpu = outs[-1][1] if outs else None
                ran = occupancy(sw, cpu, begin, end) if cpu is not None else {}
                ran = {names.get(int(k.rsplit("(", 1)[1][:-1]), k): v for k, v in ran.items()}
                found.append({"vcpu": names[tid], "ms": round(1000 * (end - begin)), "cpu": cpu,
                              "switches_there": sum(1 for s in sw if s[1] == cpu and begin <= s[0] <= end),
                              "ran_ms": {k: round(1000 * v, 1) for k, v in sorted(ran.items(), key=lambda kv: -kv[1])}})
            rounds.append({"round": r, "waits": found, "overruns": tr.overruns, "host_state": host_state(pids),
                           "cpu_shares": {names[t]: shares(t) for t in names}})
            print(f"round {r + 1}/{args.rounds}: {len(found)} waits over {args.min_ms:g} ms", flush=True)
            for f in found:
                top = list(f["ran_ms"].items())[:3]
                print(f"  {f['vcpu']} waited {f['ms']} ms on CPU {f['cpu']} ({f['switches_there']} switches there); "
                      "ran: " + ", ".join(f"{k} {v:.0f} ms" for k, v in top), flush=True)
    finally:
        guests.destroy_all(PREFIX)
        if flat is not None:
            for _ in range(50):             # the threads leave as QEMU exits
                try:
                    flat.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
    return {"command": " ".join(["python -m benchmarks.starvation", *sys.argv[1:]]),
            "config": {"guests": args.guests, "rounds": args.rounds, "seconds": args.seconds, "gap": args.gap,
                       "min_ms": args.min_ms, "flat": args.flat, "domain_type": guests.domain_type()},
            "vcpus": names, "rounds": rounds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--guests", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=8.0, help="traced interval per round")
    ap.add_argument("--gap", type=float, default=2.0, help="untraced pause before each round")
    ap.add_argument("--min-ms", type=float, default=150.0, help="report waits longer than this")
    ap.add_argument("--flat", action="store_true", help="all vCPU threads in one cpu cgroup of their own")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        ap.error("run as root: it starts guests and kernel tracing")
    res = run(args)
    out = args.out or Path("benchmarks/results") / time.strftime("starvation-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1))
    total = sum(len(r["waits"]) for r in res["rounds"])
    print(f"{total} waits over {args.min_ms:g} ms in {args.rounds} x {args.seconds:g} s; written to {out}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
