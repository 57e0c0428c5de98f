"""Which cpuset operations make the kernel recount its deadline admission total.

Run as root on a host with the v1 cpuset controller, nothing else using
SCHED_DEADLINE. A spinning child process of this script is given a deadline
reservation of 200 ms per 1 s, runs 300 ms (its budget runs out) and is
returned straight to SCHED_OTHER, its bandwidth pending release for about
half a second; a cpuset write on a directory of this script's own then
recounts the total without it, and the release, when it comes, wraps the
total below zero. Before each step the total is made wrong that way; a
step that recounts sets it right again at once.

    python steps.py > steps.txt

Prints, per step, the total (``dl_bw->total_bw`` of debugfs, mounted at
/tmp/dbg for the run) before and after, then whether a request for no
bandwidth (1,024 ns per 4.2 s) is refused on a sleeping child. First,
``masked``: a wrong total, then a request larger than its shortfall.
"""
import errno
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../.."))
from cosched.actuators.sched import SchedAttr, set_attr, zero_bandwidth  # noqa: E402
from cosched.hostfs import HostFS  # noqa: E402

DBG = "/tmp/dbg"
CPUSET = "/sys/fs/cgroup/cpuset"
HELPER, PROBE = f"{CPUSET}/cosched-evidence-helper", f"{CPUSET}/cosched-evidence-probe"


def total() -> int:
    with open(f"{DBG}/sched/debug") as f:
        return next(int(line.split()[-1]) for line in f if "total_bw" in line)


def refuses_nothing() -> str:
    sleeper = subprocess.Popen(["sleep", "5"])
    time.sleep(0.05)
    try:
        set_attr(sleeper.pid, zero_bandwidth(HostFS("/")))
        set_attr(sleeper.pid, SchedAttr())
        return "granted"
    except OSError as e:
        return errno.errorcode[e.errno]
    finally:
        sleeper.kill()
        sleeper.wait()


def write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def main() -> int:
    os.makedirs(DBG, exist_ok=True)
    mounted = not os.path.exists(f"{DBG}/sched")
    if mounted:
        subprocess.run(["mount", "-t", "debugfs", "none", DBG], check=True)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    os.mkdir(HELPER)
    flip = [0]

    def make_wrong() -> None:
        while total() >= 0:
            set_attr(spinner.pid, SchedAttr("deadline", runtime_ns=200_000_000, deadline_ns=1_000_000_000,
                                            period_ns=1_000_000_000))
            time.sleep(0.3)
            set_attr(spinner.pid, SchedAttr())                 # straight, its bandwidth pending release
            flip[0] ^= 1
            write(f"{HELPER}/cpuset.cpus", "0-1" if flip[0] else "1")   # a recount without it
            time.sleep(1.2)                                    # its release comes
    print(f"at rest: total {total()}, request for no bandwidth {refuses_nothing()}")
    steps = [("mkdir", lambda: os.mkdir(PROBE)), ("write every CPU", lambda: write(f"{PROBE}/cpuset.cpus", "0-1")),
             ("write no CPU", lambda: write(f"{PROBE}/cpuset.cpus", "\n")), ("rmdir (no CPU)", lambda: os.rmdir(PROBE)),
             ("mkdir", lambda: os.mkdir(PROBE)), ("write every CPU", lambda: write(f"{PROBE}/cpuset.cpus", "0-1")),
             ("rmdir (every CPU)", lambda: os.rmdir(PROBE))]
    try:
        make_wrong()                                           # masked: a larger request is admitted on top
        held = subprocess.Popen(["sleep", "5"])
        time.sleep(0.05)
        before, wrong = total(), refuses_nothing()
        set_attr(held.pid, SchedAttr("deadline", runtime_ns=5_000_000, deadline_ns=10_000_000,
                                     period_ns=10_000_000))
        print(f"masked: total {before} (no bandwidth: {wrong}); a sleeping child given 5 ms per 10 ms: admitted, "
              f"total {total()}, no bandwidth: {refuses_nothing()}", flush=True)
        held.kill()
        held.wait()
        for name, step in steps:
            make_wrong()
            before, wrong = total(), refuses_nothing()
            step()
            after = [total()]
            for _ in range(4):
                time.sleep(0.05)
                after.append(total())
            print(f"{name:18s} before {before} (no bandwidth: {wrong}); right after {after[0]}, "
                  f"then every 50 ms {after[1:]}; no bandwidth: {refuses_nothing()}", flush=True)
    finally:
        spinner.kill()
        spinner.wait()
        if os.path.exists(PROBE):
            write(f"{PROBE}/cpuset.cpus", "\n")
            os.rmdir(PROBE)
        write(f"{HELPER}/cpuset.cpus", "0-1")              # a last recount: the total right again
        write(f"{HELPER}/cpuset.cpus", "\n")
        os.rmdir(HELPER)
        print(f"end: total {total()}")
        if mounted:
            subprocess.run(["umount", DBG])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
