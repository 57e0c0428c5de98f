"""Root-domain rebuilds every PERIOD seconds while sampling the deadline admission total.

Run as root beside a benchmark; debugfs is mounted at /tmp/dbg for the
samples (and unmounted after). Every PERIOD seconds it writes the CPUs of
a cpuset of its own (``cosched-evidence-rebuilds`` under the v1 cpuset
root), alternately all and one, as libvirt does when it pins a vCPU or a
guest starts: each write makes the kernel rebuild its root domains and
recount the total. Every 0.1 s it prints: epoch seconds, ``total_bw``,
threads in SCHED_DEADLINE, and ``rebuild`` on the lines after a write.

    python rebuilds.py SECONDS [PERIOD] > samples.txt   (SIGTERM ends it early, cleanly)
"""
import os
import signal
import subprocess
import sys
import time

DBG = "/tmp/dbg"
CPUSET = "/sys/fs/cgroup/cpuset"
OWN = f"{CPUSET}/cosched-evidence-rebuilds"


def total() -> int:
    with open(f"{DBG}/sched/debug") as f:
        for line in f:
            if "total_bw" in line:
                return int(line.split()[-1])
    raise RuntimeError("no total_bw in sched/debug")


def deadline_threads() -> int:
    out = subprocess.run(["ps", "-eLo", "cls"], capture_output=True, text=True).stdout
    return sum(1 for line in out.splitlines() if line.strip() == "DLN")


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))    # ends it cleanly (the finally below)
    seconds = float(sys.argv[1])
    period = float(sys.argv[2]) if len(sys.argv) > 2 else 0.5
    os.makedirs(DBG, exist_ok=True)
    if not os.path.exists(f"{DBG}/sched"):
        subprocess.run(["mount", "-t", "debugfs", "none", DBG], check=True)
    os.mkdir(OWN)
    every = open(f"{CPUSET}/cpuset.effective_cpus").read().strip()
    one = every.split(",")[0].split("-")[-1]
    end, next_rebuild, flip = time.time() + seconds, time.time() + period, 0
    try:
        while time.time() < end:
            mark = ""
            if time.time() >= next_rebuild:
                flip ^= 1
                with open(f"{OWN}/cpuset.cpus", "w") as f:
                    f.write(every if flip else one)
                next_rebuild += period
                mark = " rebuild"
            print(f"{time.time():.2f} {total()} {deadline_threads()}{mark}", flush=True)
            time.sleep(0.1)
    finally:
        with open(f"{OWN}/cpuset.cpus", "w") as f:
            f.write("\n")                       # emptied first: its removal does not rebuild again
        os.rmdir(OWN)
        subprocess.run(["umount", DBG])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
