"""Every switch-in of a vCPU thread that a kept trace does not show, where the
CPU was last seen running another, busy task (not idle) and the first line
that shows the thread current there is its own ``sched_stat_runtime``: when
it had left its CPU (or, if later, when that CPU last went idle), the task
the trace last saw on that CPU, and how long the thread had run by that tick
(the kernel's ``runtime``). The parser at 007149b counted the thread running
from the first of those times; since 8be8c3d, from the tick less its
runtime.

    python benchmarks/evidence/trace-run-check/hidden.py TRACE.txt.gz ...
"""
from __future__ import annotations

import gzip
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks.trace import _LINE, _RUNTIME, _SWITCH    # noqa: E402

VCPU = re.compile(r"CPU \d+/TCG-(\d+)")


def hidden(text: str):
    tids = {int(t) for t in VCPU.findall(text)}
    curr: dict[int, int] = {}
    left: dict[int, float] = {}
    idle_since: dict[int, float] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        pid, cpu, t, kind, rest = int(m.group(2)), int(m.group(3)), float(m.group(4)), m.group(5), m.group(6)
        if pid in tids and curr.get(cpu, pid) not in (pid, 0) and kind == "sched_stat_runtime":
            r = _RUNTIME.search(rest)
            if r and int(r.group(1)) == pid and pid in left:
                yield t, cpu, pid, curr[cpu], max(left[pid], idle_since.get(cpu, 0.0)), int(r.group(2)) / 1e9
        curr[cpu] = pid
        if kind == "sched_switch":
            s = _SWITCH.search(rest)
            if s:
                curr[cpu] = int(s.group(4))
                left[int(s.group(1))] = t
                if curr[cpu] == 0:
                    idle_since[cpu] = t


def main() -> None:
    for path in sys.argv[1:]:
        print(path)
        for t, cpu, tid, before, since, ran in hidden(gzip.decompress(Path(path).read_bytes()).decode()):
            print(f"  {t:.6f} CPU {cpu} vCPU thread {tid} after task {before}: left it or it idled at {since:.6f}, "
                  f"ran {1000 * ran:.3f} ms by this tick; counted running {1000 * (t - since):.1f} ms before, "
                  f"{1000 * min(ran, t - since):.1f} ms now")


if __name__ == "__main__":
    main()
