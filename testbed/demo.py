"""``make demo``: see the problem cosched solves, on this host, in two minutes.

1. One tiny 2-vCPU guest runs a spin-barrier loop alone: its vCPUs run, the
   concurrency hazard is near zero, and its barrier throughput is the ideal.
2. Two more such guests join (6 busy vCPUs on this host's CPUs), observed
   only: vCPUs of one guest now wait while their siblings run and spin, the
   hazard and skew climb, and the aggregate throughput collapses.
3. The three guests are switched to the ``gang`` policy on the fly (``virsh
   metadata --live``): they take turns, each with all its vCPUs at once, and
   the aggregate throughput returns close to the ideal.
4. A guest of another kind joins (its vCPUs sleep between short chunks of
   work) and all four are switched to ``auto``: cosched measures each guest
   and picks its mode itself, gang for the barrier guests and a
   non-freezing mode for the sleeper; ``cosched explain`` says why.

All along, the daemon's live view (``cosched status --watch``) is printed,
with each guest's barrier throughput read from its serial console. A fourth,
idle guest carries a deliberately broken annotation to show how that is
reported. Everything is removed at the end (``--keep`` leaves it running).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from cosched.cli import render
from cosched.config import Config
from cosched.control import request
from testbed import guests, image, services
from testbed.daemon import DaemonProcess

PREFIX = "cosched-demo-"


def daemon_status() -> dict | None:
    try:
        return request(Config().socket_path, timeout=3)
    except (OSError, ValueError):
        return None


def show(title: str, gs: list[guests.Guest], seconds: float, every: float = 3.0) -> dict[str, float]:
    """Print the live view every ``every`` s for ``seconds``; return throughputs."""
    print(f"\n=== {title} ===", flush=True)
    prev = daemon_status()
    start_t = {g.name: (g.results() or [{"t_ms": 0}])[-1]["t_ms"] for g in gs}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(every)
        cur = daemon_status()
        if cur is None:
            sys.exit("demo: the daemon went away")
        print(render(cur, prev))
        for g in gs:
            tput = guests.throughput(g.results(), start_t[g.name])
            print(f"  {g.name:<22} throughput {tput:9.0f} iterations/s")
        print(flush=True)
        prev = cur
    return {g.name: guests.throughput(g.results(), start_t[g.name]) for g in gs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("DEMO_SECONDS", 18)),
                    help="length of each phase (default 18)")
    ap.add_argument("--keep", action="store_true", help="leave the guests and the daemon running")
    args = ap.parse_args()

    img = image.build()
    services.ensure()
    guests.destroy_all(PREFIX)
    daemon = None
    if daemon_status() is None:
        daemon = DaemonProcess(tempfile.mkdtemp(prefix="cosched-demo-"), state_dir=Config().state_dir,
                               port=Config().metrics_host_port()[1]).start()
        print(f"started `cosched daemon` (log: {daemon.log}, metrics: http://127.0.0.1:{daemon.port}/metrics)")
    else:
        print("using the cosched daemon already running")
    try:
        print(f"host CPUs: {len(os.sched_getaffinity(0))}; guests run as domain type '{guests.domain_type()}'")
        bad = guests.start(PREFIX + "bad-annotation", workload="idle", image=img,
                           policy=guests.annotation("gang", quantum_ms="fast"))
        first = guests.start(PREFIX + "1", workload="barrier", image=img)
        first.wait_for("cosched-result")
        alone = show("one busy 2-vCPU guest alone (the ideal)", [first], args.seconds)
        gs = [first]
        for i in (2, 3):
            with guests.paused(list(gs)):
                gs.append(guests.start(PREFIX + str(i), workload="barrier", image=img))
                gs[-1].wait_for("cosched-result")
        crowded = show("three busy 2-vCPU guests, observed only (the host's own scheduler)", gs, args.seconds)
        for g in gs:
            subprocess.run(["virsh", "-c", guests.URI, "metadata", g.name, "--uri", guests.NAMESPACE, "--key", "cosched",
                            "--set", '<policy name="gang"/>', "--live"], check=True, capture_output=True)
        print("\nset <cosched:policy name=\"gang\"/> on the three guests with `virsh metadata --live`")
        time.sleep(2)
        gang = show("the same three guests under gang co-scheduling", gs, args.seconds)
        with guests.paused(gs):
            sleeper = guests.start(PREFIX + "sleeper", workload="blocking", image=img)
            sleeper.wait_for("cosched-result")
        mixed = gs + [sleeper]
        for g in mixed:
            subprocess.run(["virsh", "-c", guests.URI, "metadata", g.name, "--uri", guests.NAMESPACE, "--key", "cosched",
                            "--set", '<policy name="auto"/>', "--live"], check=True, capture_output=True)
        print(f"\nadded '{sleeper.name}' (its vCPUs sleep between short chunks) and set "
              "<cosched:policy name=\"auto\"/> on all four")
        time.sleep(6)
        auto = show("a mixed host under auto: cosched picks each guest's mode", mixed, args.seconds)
        modes = {d["name"]: d.get("mode") for d in (daemon_status() or {}).get("domains", [])}
        ideal = alone[first.name]
        print("=== summary ===")
        print(f"one guest alone (ideal):   {ideal:9.0f} iterations/s")
        for label, result in (("three guests, host CFS:", crowded), ("three guests, gang:", gang)):
            total = sum(result.values())
            print(f"{label:<26} {total:9.0f} iterations/s in all = {100 * total / ideal:.0f}% of the ideal")
        print("Under the host's scheduler one vCPU of a guest runs and spins at the barrier while its sibling")
        print("waits for a host CPU (HAZARD%). Under gang each guest's vCPUs run together (FRZ shows who waits).")
        total = sum(auto[g.name] for g in gs)
        print(f"{'three guests, auto:':<26} {total:9.0f} iterations/s in all = {100 * total / ideal:.0f}% of the ideal, "
              f"{total / max(sum(gang.values()), 1e-9):.2f}x their gang figure, next to the sleeper "
              f"({auto[sleeper.name]:.0f} iterations/s)")
        print("Under auto: " + ", ".join(f"{g.name} -> {modes.get(g.name)}" for g in mixed) + ". Why, for two of them:")
        for g in (first, sleeper):
            config = ["--config", str(daemon.config)] if daemon else []
            explain = subprocess.run([sys.executable, "-m", "cosched", "explain", g.name, *config],
                                     capture_output=True, text=True)
            print(explain.stdout.rstrip() or explain.stderr.rstrip())
        print(f"The guest '{bad.name}' shows how an invalid annotation is reported (observed, not managed).")
        print("Try, with --keep: `cosched status --watch 2`, `cosched status --json`,")
        print("and `curl -s 127.0.0.1:9641/metrics | grep ^cosched_`.")
    finally:
        if not args.keep:
            if daemon is not None:
                daemon.stop()
            guests.destroy_all(PREFIX)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
