"""Metric truth: cosched's hazard and skew against the kernel's own scheduler trace.

Three busy 2-vCPU guests (a spin barrier: their vCPUs never idle, so a vCPU's
lag is its wait, or its frozen time under gang) run under the host scheduler
and then under ``gang``. Meanwhile the kernel's
``sched_switch``/``sched_wakeup`` events of their vCPU threads are recorded
(:mod:`benchmarks.trace`), each thread's timeline rebuilt, and the exact
hazard fraction and mean window skew computed, over the sampling windows
cosched's figures cover (from the end of the window the first scrape read
to that of the last, ``cosched_domain_observed_timestamp_seconds``: a scrape
reads the last window closed) and in windows as long as cosched's sampling
periods were (:mod:`benchmarks.stats`); cosched's figures come from its
``/metrics``, as an operator's Prometheus sees them. A trace that puts a
thread's run time over JUDGE_POINTS from the kernel's own has lost or
misplaced a switch: that measurement is discarded and taken again
(``docs/decisions/0021-truth-over-cosched-windows-judged-by-run.md``). Both
sources run, each in a daemon of its own that must report it: the in-kernel
meter, which counts, must agree per guest within 2 points of hazard and
0.5 ms of mean skew (``docs/decisions/0003-metric-truth-bounds-per-source.md``);
the ``/proc`` sampler, which estimates, within 12 points and 1 ms. For the
sampler: over 12 runs of this test in one sitting on the 2-CPU development host, the hazard was
within 3.1 points under the host scheduler (the estimate below the trace
in nearly every one) and 0.8 under ``gang``, the skew within 0.19 ms; one
clean-checkout run found 5.2 points under the host scheduler, a later one
8.2 (a guest whose vCPUs waited behind each other 99% of the time by the
trace, 91% by the estimate, next to a guest the host scheduler starved),
and earlier runs once 0.95 ms of skew
(``docs/decisions/0003-metric-truth-bounds-per-source.md``).

The daemon here may spend a quarter of a CPU on sampling, so its period stays
at the 10 ms interval. With the default 2% and six busy vCPUs on two CPUs the
period stretches to 45-84 ms and varies within a run
(``docs/decisions/0015-in-kernel-meter-against-the-trace.md``); the trace's windows, all as
long as the mean period, then differ from cosched's, and window skews reach
30 ms, so 1 ms is no longer a measure of the estimate (it once failed by 0.13
ms there). The test checks the period it judges at.
"""
from __future__ import annotations

import pytest

from benchmarks import suite
from testbed import guests

from .conftest import PREFIX, DaemonProcess

SECONDS = 8.0
PERIOD_MS = 10.0        # sample_interval_ms's default, held by the budget below
# Per source: how far cosched's hazard (points) and mean skew (ms) may lie from the trace's.
BOUNDS = {
    "proc": (12, 1.0),  # the /proc estimate under the host scheduler: once 8.2 points off (module doc)
    "meter": (2, 0.5),  # exact counts: at most 0.5 points and 0.13 ms off in six runs (docs/decisions/0003)
}
# The judge judged: how far the trace's run time of a thread may lie from the kernel's own
# (schedstat), in points, before the trace is taken to have lost or misplaced a switch and the
# measurement is repeated, at most ATTEMPTS in all (docs/decisions/0021). The kernel's wait is
# printed but not judged by: under the host scheduler it read up to 2.8 points below both the
# trace's and the meter's, which agreed.
JUDGE_POINTS = 3
ATTEMPTS = 3


def trace_off(r: dict) -> list[str]:
    """Where the trace of measurement ``r`` disagrees with the kernel's run
    time by more than JUDGE_POINTS: one line per thread."""
    return [f"{name} thread {tid}: run {run:.3f} by the trace, {w['trace']['run_kernel'][tid]:.3f} by the kernel"
            for name, w in r["per_guest"].items() for tid, run in w["trace"]["run"].items()
            if tid in w["trace"]["run_kernel"] and abs(run - w["trace"]["run_kernel"][tid]) > JUDGE_POINTS / 100]


@pytest.fixture(scope="module")
def barrier_trio(libvirtd, guest_image):
    gs = []
    try:
        for i in range(3):
            with guests.paused(gs):
                gs.append(suite.boot(f"{PREFIX}truth-{i}", "barrier", 2, guest_image))
        yield gs
    finally:
        for g in gs:
            g.destroy()


@pytest.fixture(scope="module", params=["meter", "proc"])
def observer(request, tmp_path_factory, libvirtd):
    """A daemon observing through one source: the in-kernel meter, or /proc samples."""
    meter = "auto" if request.param == "meter" else "off"
    d = DaemonProcess(tmp_path_factory.mktemp(f"daemon-{request.param}"),
                      extra_config=f'sample_budget_pct = 25\nmeter = "{meter}"\n').start()
    try:
        yield request.param, d
    finally:
        assert d.stop() == 0, d.log.read_text()


@pytest.mark.parametrize("mode", ["cfs", "gang"])
def test_hazard_and_skew_agree_with_the_kernel_trace(mode, barrier_trio, observer):
    source, daemon = observer
    gs = barrier_trio
    daemon.wait(lambda: all(daemon.domain(g.name) for g in gs), 10, "guests observed")
    observation = daemon.status()["daemon"]["observation"]
    assert observation["source"] == source, f"the daemon observes through {observation}, not {source}"
    suite.apply_mode(daemon, gs, mode, settle=1.5)
    discarded = []
    for _ in range(ATTEMPTS):
        r = suite.measure(daemon, gs, mode, SECONDS, truth=True)
        assert r["trace_overruns"] == 0, "the trace lost events"
        off = trace_off(r)
        if not off:
            break
        discarded.append("a measurement discarded, its trace off the kernel's accounting: " + "; ".join(off))
    assert not off, "\n".join(discarded)
    rows = []
    for name, w in r["per_guest"].items():
        t = w["trace"]
        rows.append(f"{name}: hazard cosched {w['hazard']:.3f} trace {t['hazard']:.3f}; "
                    f"skew cosched {w['skew_mean_ms']:.2f} ms trace {t['skew_mean_ms']:.2f} ms "
                    f"over {w['window_ms']:.1f} ms windows; "
                    f"{t['events']} events")
        rows.extend(f"  thread {tid}: run cosched {v.get('run', 0):.3f} trace {t['run'].get(tid, 0):.3f} "
                    f"kernel {t['run_kernel'].get(tid, 0):.3f}; wait cosched {v.get('wait', 0):.3f} "
                    f"trace {t['wait'].get(tid, 0):.3f} kernel {t['wait_kernel'].get(tid, 0):.3f}"
                    for tid, v in w["vcpus"].items())
    report = "\n".join([f"{source} {mode}:", *discarded, *rows])
    print("\n" + report)
    hazard_points, skew_ms = BOUNDS[source]
    for name, w in r["per_guest"].items():
        t = w["trace"]
        assert t["events"] >= 20, f"{name}: too few trace events to judge\n{report}"
        assert w["hazard"] is not None and w["skew_mean_ms"] is not None, report
        assert w["window_ms"] <= 1.2 * PERIOD_MS, f"{name}: the sampling period stretched\n{report}"
        assert abs(w["hazard"] - t["hazard"]) <= hazard_points / 100, \
            f"{name}: hazard off by more than {hazard_points} points\n{report}"
        assert abs(w["skew_mean_ms"] - t["skew_mean_ms"]) <= skew_ms, \
            f"{name}: skew off by more than {skew_ms} ms\n{report}"
    if mode == "gang":
        assert r["switches"] > 0, "gang never rotated"
