"""Where the switcher's CPU went, from py-spy's raw flamegraph lines
(``probe.py``'s ``OUT``): each sample put under the first of these parts
its stack shows.

    python benchmarks/evidence/boost-switcher-profile/analyse.py profile.txt
"""
from __future__ import annotations

import sys
from collections import Counter

PARTS = (   # (part, a frame its stacks hold), first match wins
    ("boost: whether the reservation is fresh (/proc/TID/stat and sched)", "SchedKnob.fresh"),
    ("unboost: whether it may leave straight (/proc/TID/stat and sched)", "SchedKnob._straight"),
    ("unboost: frozen around the zero reservation", "Switcher._still"),
    ("boost and unboost: sched_setattr", "set_attr"),
    ("looks: each vCPU's /proc files (Switcher._see)", "Switcher._see"),
    ("the rules (Bcs.step)", "Bcs.step"),
)


def main() -> None:
    parts, total = Counter(), 0
    for line in open(sys.argv[1]):
        stack, n = line.rstrip().rsplit(" ", 1)
        total += int(n)
        frames = stack.split(";")
        part = next((name for name, frame in PARTS if any(f.startswith(frame + " ") for f in frames)), None)
        if part is None:      # the loop's own line: its select() between looks, nearly always
            part = "the serve loop itself (select() between looks)" if frames[-1].startswith("serve ") else "other"
        parts[part] += int(n)
    print(f"{total} samples")
    for part, n in parts.most_common():
        print(f"{n / total * 100:5.1f}%  {part}")


if __name__ == "__main__":
    main()
