"""Two sleepers (sleeper.py), one pinned to each CPU, under the benchmark's
ftrace instance for 1 s: switches from and to each CPU's idle task.

    python benchmarks/evidence/meter-pingpong-wait/ftrace_idle.py
"""
import subprocess, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
SLEEPER = str(Path(__file__).with_name("sleeper.py"))
from benchmarks.trace import SchedTrace
ps = [subprocess.Popen([sys.executable, SLEEPER, str(c), "4"]) for c in (0, 1)]
time.sleep(0.5)
with SchedTrace({p.pid for p in ps}) as t:
    time.sleep(1.0)
for p in ps: p.wait()
txt = t.text
for c in (0, 1):
    print(c, "from idle", txt.count(f"prev_comm=swapper/{c} "), "to idle", txt.count(f"next_comm=swapper/{c} "))
import re
print(sorted(set(re.findall(r"\[00(\d)\]", txt))))
