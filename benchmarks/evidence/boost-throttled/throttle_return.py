"""A process of its own (a spinning counter) boosted as boost boosts it, next to two
spinning ones, with this process at SCHED_FIFO 10 (above them, below deadline):
progress and budget (dl.runtime) per 2 ms window, before and after a boost left
10 ms so that it runs out of budget, returned through the zero reservation
(default), kept in SCHED_DEADLINE until refilled first (wait), or returned
straight to its policy (direct). Run from the project root as root:
.venv/bin/python benchmarks/evidence/boost-throttled/throttle_return.py [wait|direct]"""
import functools, mmap, os, re, struct, subprocess, sys, time
print = functools.partial(print, flush=True)
sys.path.insert(0, ".")
from cosched.actuators.sched import SchedAttr, set_attr, zero_bandwidth
from cosched.hostfs import HostFS
B = SchedAttr("deadline", runtime_ns=4_000_000, deadline_ns=8_000_000, period_ns=8_000_000)
Z = zero_bandwidth(HostFS("/"))
CHILD = """
import mmap, struct
f = open('/tmp/cosched-throttle-ctr', 'r+b'); m = mmap.mmap(f.fileno(), 8)
n = 0
while True:
    n += 1
    if n % 1000 == 0: m[0:8] = struct.pack('Q', n)
"""
open('/tmp/cosched-throttle-ctr', 'wb').write(b'\0' * 8)
f = open('/tmp/cosched-throttle-ctr', 'r+b'); m = mmap.mmap(f.fileno(), 8)
ctr = lambda: struct.unpack('Q', m[0:8])[0]
rt = lambda pid: (x := re.search(r"dl\.runtime\s*:\s*(-?\d+)", open(f"/proc/{pid}/sched").read())) and int(x.group(1))
c = subprocess.Popen([sys.executable, "-c", CHILD])
spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))     # this process above the spinners, below deadline
time.sleep(0.5)
try:
    def window(boost):
        a = ctr()
        if boost: set_attr(c.pid, B)
        time.sleep(0.002)
        r = rt(c.pid) if boost else None
        if boost: set_attr(c.pid, Z); set_attr(c.pid, SchedAttr())
        return ctr() - a, r
    print("CFS windows:", [window(False)[0] for _ in range(3)])
    print("fresh boosts:", [ (window(True), time.sleep(0.010))[0] for _ in range(3)])
    set_attr(c.pid, B); time.sleep(0.010)            # left boosted 10 ms: runs out of its 4 ms, throttled
    print("throttled at", rt(c.pid))
    if len(sys.argv) > 1 and sys.argv[1] == "wait":     # kept in its reservation until the kernel refills it
        t = time.monotonic()
        while rt(c.pid) <= 0 and time.monotonic() - t < 0.1:
            time.sleep(0.0002)
        print("refilled after", round((time.monotonic() - t) * 1000, 2), "ms:", rt(c.pid))
    if len(sys.argv) > 1 and sys.argv[1] == "direct":   # returned without the zero reservation
        set_attr(c.pid, SchedAttr())
    else:
        set_attr(c.pid, Z); set_attr(c.pid, SchedAttr())
    time.sleep(0.012)
    print("later boosts:", [ (window(True), time.sleep(0.010))[0] for _ in range(5)])
    print("CFS windows after:", [window(False)[0] for _ in range(3)])
finally:
    for p in (c, *spin):
        try: os.sched_setscheduler(p.pid, os.SCHED_OTHER, os.sched_param(0))
        except OSError: pass
        p.kill(); p.wait()
