"""Two sleepers (sleeper.py), one pinned to each CPU, under the benchmark's
ftrace instance for 1 s: switches from and to each CPU's idle task.

    python benchmarks/evidence/meter-pingpong-wait/ftrace_idle.py
"""
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
from benchmarks.trace import SchedTrace  # noqa: E402
from trace_counts import idle_switches    # noqa: E402  (this directory)

ps = [subprocess.Popen([sys.executable, str(HERE / "sleeper.py"), str(c), "4"]) for c in (0, 1)]
time.sleep(0.5)
with SchedTrace({p.pid for p in ps}) as t:
    time.sleep(1.0)
for p in ps:
    p.wait()
for k, v in idle_switches(t.text).items():
    print(k, v)
