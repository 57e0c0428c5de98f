"""Per-thread CPU of the daemon and switcher at 4 barrier guests under one mode (scratch)."""
import os, subprocess, sys, time
from benchmarks.suite import under_mode
mode, secs = sys.argv[1], float(sys.argv[2])
def tasks(pid):
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try: out[int(t)] = int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0])
        except OSError: pass
    return out
with under_mode(["barrier"] * 4, mode) as (daemon, gs):
    time.sleep(8)
    pid = daemon.proc.pid
    sw = [int(p) for p in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()]
    pids = [pid] + sw
    s0 = daemon.status()["daemon"]; a = {p: tasks(p) for p in pids}; t0 = time.monotonic()
    time.sleep(secs)
    b = {p: tasks(p) for p in pids}; dt = time.monotonic() - t0; s1 = daemon.status()["daemon"]
    dump = subprocess.run(["/work/tools/bin/py-spy", "dump", "-p", str(pid), "--subprocesses"], capture_output=True, text=True).stdout
    print(f"{mode}: {dt:.1f} s, samples/s {(s1['samples'] - s0['samples']) / dt:.1f}, period_ms {s1.get('sample_period_ms')}")
    for p in pids:
        for t in sorted(b[p]):
            d = (b[p][t] - a[p].get(t, 0)) / 1e9 / dt * 100
            if d > 0.01: print(f"  pid {p} tid {t}: {d:.3f}% of a CPU")
    open(f"/work/prof/{mode}-dump.txt", "w").write(dump)
