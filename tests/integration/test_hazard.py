"""Concurrency hazard measured on real guests: overcommitted vs alone.

Both sides are measured in the same run, on the same host, one after the
other. On a 2-CPU host three busy 2-vCPU guests (6 vCPUs on 2 CPUs) leave
vCPUs waiting while a sibling runs; one guest alone still sees some hazard
(QEMU's own threads, libvirtd and the daemon preempt its vCPUs now and then),
so the test asks for a clear ratio, not zero. Hazard time can never exceed
the time the guest's vCPUs ran, so a guest the host scheduler starves has
little of it: the claim is about the guests that get to run.
"""
from __future__ import annotations

import time

from testbed import guests

WINDOW = 6.0
RUNS = 0.10        # a guest "gets to run" when its vCPUs ran >= 10% of the window


def measure(daemon, names: list[str], seconds: float) -> dict[str, tuple[float, float]]:
    """Per guest over the next ``seconds``: (hazard fraction, mean vCPU run fraction)."""
    def figures():
        doms = {d["name"]: d for d in daemon.status()["domains"]}
        return {n: (doms[n]["hazard_seconds"], doms[n]["observed_seconds"],
                    sum(v["run_seconds"] for v in doms[n]["vcpus"]) / len(doms[n]["vcpus"])) for n in names}
    before = figures()
    time.sleep(seconds)
    after = figures()
    out = {}
    for n in names:
        span = max(after[n][1] - before[n][1], 1e-9)
        out[n] = ((after[n][0] - before[n][0]) / span, (after[n][2] - before[n][2]) / span)
    return out


def test_hazard_high_when_overcommitted_low_alone(daemon, start_guest):
    a = start_guest("hazard-a", workload="barrier")
    a.wait_for("cosched-result")
    daemon.wait(lambda: daemon.domain(a.name), 3, "guest a observed")
    alone, alone_run = measure(daemon, [a.name], WINDOW)[a.name]
    assert alone_run > 0.5, f"a guest alone on the host should run most of the time, ran {alone_run:.2f}"

    others = []
    for s in "bc":
        with guests.paused([a, *others]):
            others.append(start_guest(f"hazard-{s}", workload="barrier"))
            others[-1].wait_for("cosched-result")
    names = [a.name] + [g.name for g in others]
    daemon.wait(lambda: all(daemon.domain(n) for n in names), 3, "all guests observed")
    crowded = measure(daemon, names, WINDOW)
    print(f"alone: hazard={alone:.3f} run={alone_run:.2f}; crowded (hazard, run): {crowded}")

    running = {n: (h, run) for n, (h, run) in crowded.items() if run >= RUNS}
    assert running, f"no guest got {RUNS:.0%} of a CPU: {crowded}"
    # How much depends on whether the host scheduler happens to run a guest's
    # two vCPUs on both CPUs at once (observed 0.13 to 0.86); never near alone.
    # Hazard cannot exceed the time the vCPUs ran, so the comparison is per
    # second run: a guest that ran 12% cannot show 4x the hazard of one that
    # ran 94% (seen: alone 0.073 at 94%, crowded 0.23 at 12%, i.e. 0.08 vs 1.9
    # per second run).
    for name, (frac, run) in running.items():
        assert frac > 0.08, f"{name}: hazard fraction {frac:.3f} with 6 busy vCPUs on 2 CPUs"
        assert frac / run > 4 * alone / alone_run, (
            f"{name}: crowded {frac:.3f} per {run:.2f} run not clearly above alone {alone:.3f} per {alone_run:.2f}")
