"""Four guests of one workload under the host scheduler and a meter of the
probe's own (OBJECT: a built meter, by default the project's): after SECONDS,
with every guest paused (its vCPU threads asleep), does each guest's count of
running and waiting threads in the meter's map match its threads' states?

    python benchmarks/evidence/meter-idle-wake/drift.py WORKLOAD SECONDS [OBJECT]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from cosched.sampler.meter import OBJECT, RUNNING, UNKNOWN, WAITING, Meter, _Guest, _Thread  # noqa: E402
from testbed import guests, image                                                             # noqa: E402

GUESTS = 4


def counts(m: Meter) -> tuple[dict, dict]:
    """Per guest: (running, waiting) as its map entry counts them, and as its threads' states say."""
    threads, gs = m._dump("threads", _Thread, 16), m._dump("guests", _Guest, 16)
    said = {gid: (g.running, g.waiting) for gid, g in sorted(gs.items())}
    states = {gid: (sum(t.guest == gid and t.state == RUNNING for t in threads.values()),
                    sum(t.guest == gid and t.state == WAITING for t in threads.values())) for gid in said}
    return said, states


def main() -> None:
    workload, seconds = sys.argv[1], float(sys.argv[2])
    obj = Path(sys.argv[3]) if len(sys.argv) > 3 else OBJECT
    img = image.build()
    gs = []
    try:
        gs = [guests.start(f"cosched-drift-{i}", image=img, workload=workload, policy=guests.annotation("none"))
              for i in range(GUESTS)]
        for g in gs:
            g.wait_for("cosched-result")
        with Meter.load(obj) as m:
            for i, g in enumerate(gs):
                m.add(i + 1, {tid: UNKNOWN for tid in guests.vcpu_threads(g.name)})
            first = m.read()
            time.sleep(seconds)
            last = m.read()
            with guests.paused(gs):
                time.sleep(0.5)
                said, states = counts(m)
        hazard = {gid: round((last.guests[gid].hazard - first.guests[gid].hazard) / seconds * 100, 1)
                  for gid in sorted(last.guests)}
        print(f"{obj.name}: paused, (running, waiting) per guest: map {said}, threads {states}; "
              f"hazard % while running {hazard}; {'MISMATCH' if said != states else 'match'}")
    finally:
        for g in gs:
            g.destroy()


if __name__ == "__main__":
    main()
