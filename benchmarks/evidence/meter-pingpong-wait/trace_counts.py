"""One pingpong guest alone under a daemon with its defaults; 1 s of the
benchmark's own ftrace instance (benchmarks.trace.SchedTrace) on its vCPU
threads, kept as text; then each vCPU's events replayed through the meter's
rules, counting events that do not follow (a switch-out without a switch-in).

    python benchmarks/evidence/meter-pingpong-wait/trace_counts.py [OUT.txt]
"""
import time, tempfile, re, collections, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from testbed import guests, image
from testbed.daemon import DaemonProcess
from benchmarks.trace import SchedTrace
img = image.build()
d = DaemonProcess(Path(tempfile.mkdtemp()), extra_config="").start()
try:
    g = guests.start("cosched-probe-pp", image=img, workload="pingpong", policy=guests.annotation("none"))
    g.wait_for("cosched-result"); time.sleep(2)
    dom = d.domain(g.name); tids = {v["tid"] for v in dom["vcpus"]}
    with SchedTrace(tids) as t:
        time.sleep(1.0)
    text = t.text
finally:
    g.destroy(); d.stop()
Path(sys.argv[1] if len(sys.argv) > 1 else "pingpong-ftrace.txt").write_text(text)
sw = re.compile(r"\[(\d+)\].*?(\d+\.\d+): sched_switch: .*prev_pid=(\d+) .*prev_state=(\S+) ==> .*next_pid=(\d+)")
wk = re.compile(r"\[(\d+)\].*?(\d+\.\d+): sched_wakeup: .*pid=(\d+) .*target_cpu=(\d+)")
state = {}; anomalies = collections.Counter(); kinds = collections.Counter()
for line in text.splitlines():
    m = sw.search(line)
    if m:
        cpu, ts, prev, pst, nxt = m.groups(); prev, nxt = int(prev), int(nxt)
        if prev == nxt: anomalies["prev==next"] += 1
        if prev in tids:
            kinds["out " + pst] += 1
            if state.get(prev) not in (None, "run"): anomalies[f"out while {state.get(prev)}"] += 1
            state[prev] = "wait" if pst.startswith("R") else "sleep"
        if nxt in tids:
            if state.get(nxt) == "run": anomalies["in while run"] += 1
            if state.get(nxt) == "sleep": anomalies["in while sleep (no wakeup)"] += 1
            state[nxt] = "run"
        continue
    m = wk.search(line)
    if m:
        cpu, ts, pid, tcpu = m.groups(); pid = int(pid)
        if pid in tids:
            kinds["wakeup"] += 1
            s = state.get(pid)
            anomalies[f"wakeup while {s}"] += 1
            if s != "run": state[pid] = "wait"
print(kinds); print(anomalies)
