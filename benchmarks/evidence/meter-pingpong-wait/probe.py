"""One guest alone, observed by a daemon with its defaults (the in-kernel
meter): each vCPU's run and wait time as the meter counts them (status),
against the kernel's own totals (/proc/PID/task/TID/schedstat: run time,
run delay, switches in), over the same 3 s intervals.

    python benchmarks/evidence/meter-pingpong-wait/probe.py [WORKLOAD ...] > out.json
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from cosched.kernel import parse_schedstat            # noqa: E402
from testbed import guests, image                      # noqa: E402
from testbed.daemon import DaemonProcess              # noqa: E402

INTERVALS, SECONDS = 3, 3.0


def schedstat(pid: int, tids: list[int]) -> dict[int, tuple[int, int, int]]:
    return {t: parse_schedstat(Path(f"/proc/{pid}/task/{t}/schedstat").read_bytes()) for t in tids}


def measure(daemon: DaemonProcess, name: str) -> list[dict]:
    out = []
    for _ in range(INTERVALS):
        a = daemon.domain(name)
        pid, tids = a["pid"], [v["tid"] for v in a["vcpus"]]
        k0 = schedstat(pid, tids)
        time.sleep(SECONDS)
        b = daemon.domain(name)
        k1 = schedstat(pid, tids)
        obs = b["observed_seconds"] - a["observed_seconds"]
        out.append({
            "observed_s": obs,
            "meter_hazard": (b["hazard_seconds"] - a["hazard_seconds"]) / obs,
            "meter_run": [(y["run_seconds"] - x["run_seconds"]) / obs for x, y in zip(a["vcpus"], b["vcpus"])],
            "meter_wait": [(y["wait_seconds"] - x["wait_seconds"]) / obs for x, y in zip(a["vcpus"], b["vcpus"])],
            "kernel_run": [(k1[t][0] - k0[t][0]) / 1e9 / obs for t in tids],
            "kernel_wait": [(k1[t][1] - k0[t][1]) / 1e9 / obs for t in tids],
            "switches_in": [k1[t][2] - k0[t][2] for t in tids],
        })
    return out


def main() -> None:
    workloads = sys.argv[1:] or ["pingpong", "barrier", "blocking"]
    img = image.build()
    daemon = DaemonProcess(Path(tempfile.mkdtemp(prefix="cosched-probe-")), extra_config="").start()
    results = {"observation": None, "runs": {}}
    try:
        for wl in workloads:
            g = guests.start(f"cosched-probe-{wl}", image=img, workload=wl, policy=guests.annotation("none"))
            try:
                g.wait_for("cosched-result")
                time.sleep(2.0)
                results["observation"] = daemon.status()["daemon"]["observation"]
                results["runs"][wl] = measure(daemon, g.name)
            finally:
                g.destroy()
    finally:
        daemon.stop()
    json.dump(results, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
