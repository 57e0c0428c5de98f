"""Guests under one policy, a daemon with its defaults: each cosched
process's CPU over 10 s (utime + stime from /proc/PID/stat), then, with
py-spy (``PYSPY``: not a project dependency; installed in a venv of its
own), a 10 s profile of the switcher at 200 samples a second, written as
raw flamegraph lines to ``OUT``.

    PYSPY=/path/to/py-spy python benchmarks/evidence/boost-switcher-profile/probe.py barrier 2 boost OUT
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from testbed import guests, image                      # noqa: E402
from testbed.daemon import DaemonProcess              # noqa: E402


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def main() -> None:
    workload, n, policy, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    img = image.build()
    daemon = DaemonProcess(Path(tempfile.mkdtemp(prefix="cosched-profile-")), extra_config="").start()
    gs = []
    try:
        gs = [guests.start(f"cosched-profile-{i}", image=img, workload=workload, policy=guests.annotation(policy))
              for i in range(n)]
        for g in gs:
            g.wait_for("cosched-result")
        time.sleep(3.0)
        listed = subprocess.run(["pgrep", "-af", r"cosched(\.engine\.switcher| daemon)"], capture_output=True,
                                text=True).stdout.splitlines()
        procs = {int(line.split()[0]): line.split(None, 1)[1] for line in listed}
        before = {p: cpu_ticks(p) for p in procs}
        time.sleep(10.0)
        for p, cmd in procs.items():
            share = (cpu_ticks(p) - before[p]) / os.sysconf("SC_CLK_TCK") / 10.0
            print(f"{share * 100:5.1f}% of a CPU  {cmd}")
        switcher = next(p for p, cmd in procs.items() if "switcher" in cmd)
        subprocess.run([os.environ["PYSPY"], "record", "-p", str(switcher), "-d", "10", "-r", "200", "-f", "raw",
                        "-o", out], check=True)
    finally:
        for g in gs:
            g.destroy()
        daemon.stop()


if __name__ == "__main__":
    main()
