"""The co-scheduling benchmark suite: guest workloads under every scheduling mode.

    python -m benchmarks.suite [--guests 2,3,4] [--vcpus 2] [--workloads barrier,deadline,...]
        [--modes batch,cfs,gang,partial,boost] [--seconds 6] [--reps 2] [--retries 2] [--no-truth] [--out DIR]

``make bench`` runs the full suite, ``make bench-smoke`` a small one (about
two minutes). For each workload (see ``testbed/workloads/guest-init.c``):

for each guest count, that many guests boot and each repetition measures,
on the same booted guests:

   ``alone``    the first guest with the others paused by libvirt: the
                *ideal* of this repetition (what the host gives one guest),
                measured right next to the modes it normalises, since
                this host's speed drifts from minute to minute; pooled, the
                one-guest point of every plot;
   ``batch``    guests one after another, each alone for an equal share of
                the interval in its own time (the others paused by libvirt,
                whose clock then stands still, so a paused guest sees no delay);
   ``cfs``      all at once under the host scheduler, observed only;
   ``gang``, ``partial``, ``boost``, ...  all at once under that cosched
                preset, switched live through the libvirt annotation; a
                mode may set the preset's parameters too, each after a
                colon (``boost:pause-ms=0``), to compare settings in one run.

``alone`` comes first in every repetition; the modes follow in the order
given in even repetitions and in reverse in odd ones (:func:`in_turn`), so
that the host's drift does not always fall on the same mode.

Per guest and run it records throughput and missed deadlines over exactly
the interval, from the guest's live counters read from its memory right
after ``t0`` and right before ``t1`` (:func:`counted`; iterations per second
of host time between the two reads); the histogram of iteration times and
the rate per whole second from the result lines the guest printed inside
the interval (lines counted after ``t0`` and before ``t1``), and what those
lines alone would give (``line_rate``, ``line_coverage``: the guest time
they span over the interval); and cosched's own hazard and skew figures for
the interval. Per run: the daemon's switch latency, slot lateness and CPU
time (daemon and switcher, percent of one CPU), and each vCPU thread's
affinity, scheduling policy and cgroups at the start and at the end
(``host_state``, read from /proc by this module alone), each guest's mode
at both ends (``modes``), and for guests under ``auto`` the signals its
choice rested on at the end (``auto_signals``, from ``cosched explain``).

A run is *valid* when every guest's measurement covers at least 90% of the
interval: the two counter reads span it (they always do, unless the
harness itself was held up), and in ``batch`` the guest's result lines
span its turn. An invalid run is measured again (``--retries`` times); if
it stays invalid it is kept in ``results.json`` with ``valid: false``,
shown as invalid in the report and never averaged in. In ``batch`` each
guest runs alone until its lines span its share of the interval in its own
time (:func:`batch_turn`); the run's interval is the sum of those spans,
so neither the harness's work between turns nor a guest's resume counts. With truth
on (the default), every non-batch run also records the kernel's scheduler
and cgroup-freeze events of the vCPU threads (:mod:`benchmarks.trace`) and
computes each guest's exact hazard fraction and window skew over the same
interval (:mod:`benchmarks.stats`), for the metric-truth comparison. The
guests are paused from the interval's end until its figures are done, so
reading and parsing the trace (millions of events under ``relaxed``) does
not compete with busy guests for the CPUs: on 2 CPUs such a run took
minutes.

With ``--steady SECONDS``, once a workload's repetitions at a guest count
are done, the same guests run under ``auto`` for SECONDS more (after
:data:`AUTO_SETTLE` to choose), the status read every 0.25 s: how often
``auto`` changes a steady guest's mode (:func:`steady_figures`; the
target is at most once a minute). ``--mixed`` and ``--phases`` add mixed
hosts and guests that change phase (:func:`run_mixed`, :func:`run_phases`).

Output folder (default ``benchmarks/results/suite-<time>``): ``results.json``
(every run, raw), ``summary.md`` and PNG plots (:mod:`benchmarks.report`).
``results.json`` is written again after every run, with ``complete: false``
until the last: a suite stopped part way (a time limit, SIGTERM, Ctrl-C)
keeps every run it finished, and ``python -m benchmarks.report DIR`` draws
the tables from them. ``python -m benchmarks.suite --resume DIR`` goes on
with the same command where it stopped: it keeps every finished *unit* (a
workload at one guest count, a mixed host, the phase runs: each unit's
modes and repetitions measured together, on the same booted guests) and
measures the others, a unit left half done from its start. The runs of
that half-done unit stay in ``results.json`` under ``superseded``, and
each run names its ``sitting``; the report says how many sittings there
were.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from benchmarks import commit, report
from benchmarks.stats import (RUNNABLE, RUNNING, SLEEPING, episode_figures, frozen_at, hazard_episodes,
                              hist_delta, reconstructed, states_at, timelines, trace_figures, window_skews)
from benchmarks.trace import SchedTrace
from cosched.config import METER_MODES, Config
from cosched.policy.watch import HELD
from testbed import guests, image, services
from testbed.daemon import DaemonProcess

PREFIX = "cosched-bench-"
WORKLOADS = ("barrier", "deadline", "spinlock", "lu", "ep", "blocking", "pingpong")
MODES = ("batch", "cfs", "gang", "partial", "boost", "relaxed", "auto")
STATIC = ("cfs", "gang", "partial", "boost", "relaxed")   # what auto is judged against
PHASE_MODES = ("cfs", "gang", "boost", "auto")
AUTO_SETTLE = 8.0         # seconds for auto to measure and choose before a run
# real guest software from Debian's archive (testbed.image.SOFTWARE), run again and again by the
# guest's `exec` workload: a parallel compressor (and the same on one thread), a lock-heavy thread
# benchmark, a one-thread prime search, a pipe between two tools
SOFTWARE = {"pigz": "exec /usr/bin/pigz -p 2 -c /data", "pigz-1": "exec /usr/bin/pigz -p 1 -c /data",
            "sysbench-cpu": "exec /usr/bin/sysbench cpu --threads=1 --cpu-max-prime=2000 --events=200 --time=0 run",
            "sysbench-threads": "exec /usr/bin/sysbench threads --threads=2 --thread-locks=1 --events=20 --time=0 run",
            "dd|cat": "exec /usr/bin/dd if=/dev/zero bs=512 count=2000 | /usr/bin/cat"}
# mixed hosts, by name: a guest that mostly sleeps beside synchronising guests (x3, x4); a busy
# guest that gains nothing from co-scheduling (one busy thread in two vCPUs) beside them (busy-),
# two of them beside a spin barrier (busy2-x3); real software beside a spin barrier (software-):
# auto's thresholds were never tuned on these
MIXED = {"x3": ("blocking", "barrier", "pingpong"), "x4": ("blocking", "barrier", "pingpong", "lu"),
         "busy-x3": ("ep threads=1", "barrier", "spinlock"), "busy-x4": ("ep threads=1", "barrier", "spinlock", "lu"),
         "busy2-x3": ("ep threads=1", "deadline threads=1", "barrier"),
         "software-x3": ("pigz", "barrier", "sysbench-threads"),
         "software-x4": ("pigz", "barrier", "sysbench-threads", "dd|cat"),
         "software-busy2-x3": ("pigz-1", "sysbench-cpu", "barrier")}
# Mixed hosts of real guest software, kept out of tuning: auto's thresholds were
# set on the synthetic workloads and rows, and are reported on these unchanged.
HELD_OUT = frozenset({"software-x3", "software-x4", "software-busy2-x3"})
PHASE_MS = 20000
REPORT_MS = 100           # guests print a result line this often
MIN_COVERAGE = 0.9        # a run is valid when each guest's lines span 90% of its interval
SKEW_WINDOW = 0.010       # the daemon's default sampling interval (its period, unless stretched)


# -- reading the daemon ------------------------------------------------------
def scrape(daemon: DaemonProcess) -> dict:
    """The figures this suite reads from ``/metrics``: per-domain hazard,
    observed and skew (sum, count), per-vCPU run and wait (``vcpus``, keyed
    ``(domain, vcpu)``), the switch and lateness histograms, and per domain
    ``until``: when the sampling window its figures end with ended
    (``CLOCK_MONOTONIC`` seconds; a scrape reads the last window closed)."""
    out: dict = {"domains": {}, "vcpus": {}, "hist": {}}
    text = daemon.metrics()
    unix_to_monotonic = time.monotonic() - time.time()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            dom = s.labels.get("domain")
            if s.name == "cosched_domain_concurrency_hazard_seconds_total":
                out["domains"].setdefault(dom, {})["hazard"] = s.value
            elif s.name == "cosched_domain_observed_seconds_total":
                out["domains"].setdefault(dom, {})["observed"] = s.value
            elif s.name == "cosched_domain_observed_timestamp_seconds":
                out["domains"].setdefault(dom, {})["until"] = s.value + unix_to_monotonic
            elif s.name in ("cosched_domain_skew_seconds_sum", "cosched_domain_skew_seconds_count"):
                out["domains"].setdefault(dom, {})[s.name.rsplit("_", 1)[1]] = s.value
            elif s.name in ("cosched_vcpu_run_seconds_total", "cosched_vcpu_wait_seconds_total"):
                out["vcpus"].setdefault((dom, s.labels["vcpu"]), {})[s.name.split("_")[2]] = s.value
            elif s.name in ("cosched_switch_latency_seconds_bucket", "cosched_slot_lateness_seconds_bucket"):
                out["hist"].setdefault(s.name, []).append((float(s.labels["le"]), s.value))
    return out


def quantile(q: float, before: list, after: list) -> float | None:
    """``histogram_quantile`` over the increase between two scrapes of
    cumulative ``(le, count)`` buckets (interpolated within a bucket)."""
    counts = [(le, a - b) for (le, a), (_, b) in zip(after, before)] if before else after
    if not counts or counts[-1][1] <= 0:
        return None
    rank = q * counts[-1][1]
    prev_le, prev_c = 0.0, 0.0
    for le, c in counts:
        if c >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_c) / max(c - prev_c, 1e-12)
        prev_le, prev_c = le, c
    return prev_le


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 3)


# -- reading the guests -------------------------------------------------------
def guest_window(results: list[dict], first: int, last: int, interval: float) -> dict:
    """A guest's figures from its result lines ``first`` to ``last - 1``: the
    lines it printed inside an interval of ``interval`` host seconds.

    Throughput is per second of guest time between the first and the last of
    those lines (guest time stands still while libvirt pauses the guest, so
    a batch turn is measured as the guest saw it), and ``rates_1s`` per whole
    second of it. ``coverage`` is the guest time they span over
    ``interval``; ``valid`` when at least MIN_COVERAGE.
    """
    rs = results[first:last]
    if len(rs) < 2:
        return {"rate": 0.0, "iters": 0, "missed": 0, "errors": 0, "hist": {}, "guest_seconds": 0.0,
                "lines": len(rs), "coverage": 0.0, "valid": False}
    a, b = rs[0], rs[-1]
    span = max(b["t_ms"] - a["t_ms"], 1) / 1000
    coverage = span / interval
    return {"rate": (b["iters"] - a["iters"]) / span, "iters": b["iters"] - a["iters"],
            "rates_1s": second_rates(rs),
            "missed": b.get("missed", 0) - a.get("missed", 0), "errors": b.get("errors", 0) - a.get("errors", 0),
            "hist": hist_delta(a.get("hist", {}), b.get("hist", {})), "guest_seconds": span,
            "lines": len(rs), "coverage": coverage, "valid": coverage >= MIN_COVERAGE}


def live_counters(gs: list[guests.Guest]) -> dict[str, tuple[float, dict]]:
    """Each guest's live counters (:meth:`testbed.guests.Guest.counters`) and
    the host's monotonic time of the read."""
    out = {}
    for g in gs:
        c = g.counters()
        if c is None:
            raise RuntimeError(f"{g.name} has not said where its live counters are")
        out[g.name] = (time.monotonic(), c)
    return out


def counted(start: tuple[float, dict], end: tuple[float, dict], interval: float, lines: dict) -> dict:
    """A guest's figures over an interval from its live counters read at the
    interval's two ends: exact, whether or not the guest printed anything
    meanwhile (a guest whose vCPUs the host starves prints nothing, but its
    counters still stand where it left them). Throughput is per second of
    host time between the two reads, ``coverage`` that time over
    ``interval``. What the result lines said (``lines``, from
    :func:`guest_window`) is kept as ``line_rate`` and ``line_coverage``: the
    histogram and the per-second rates still come from them."""
    (ta, a), (tb, b) = start, end
    seconds = tb - ta
    coverage = seconds / interval if interval > 0 else 0.0
    return {"rate": (b["iters"] - a["iters"]) / seconds if seconds > 0 else 0.0, "iters": b["iters"] - a["iters"],
            "missed": b["missed"] - a["missed"], "errors": b["errors"] - a["errors"], "counted_seconds": seconds,
            "coverage": coverage, "valid": coverage >= MIN_COVERAGE,
            "line_rate": lines["rate"], "line_coverage": lines["coverage"]}


def second_rates(rs: list[dict]) -> list[float]:
    """Rates over consecutive whole seconds of guest time, each between the
    first line at or after its start and the first at or after its end: the
    noise within an interval, next to the spread between repetitions."""
    out, i = [], 0
    for j, r in enumerate(rs):
        if r["t_ms"] - rs[i]["t_ms"] >= 1000:
            out.append((r["iters"] - rs[i]["iters"]) * 1000 / (r["t_ms"] - rs[i]["t_ms"]))
            i = j
    return out


def mode_policy(mode: str) -> tuple[str, dict[str, str]]:
    """The preset a mode puts guests under, and the parameters it sets:
    ``batch`` and ``cfs`` are ``none``; ``boost:pause-ms=0`` is ``boost``
    with ``pause-ms="0"``. A list, comma-separated in the annotation, is
    written with ``+`` (``auto:allow=none+gang+partial``), since commas part
    the modes."""
    name, *pairs = mode.split(":")
    if not all("=" in p for p in pairs):
        raise ValueError(f"mode {mode!r}: parameters are written name=value after a colon")
    return (("none" if name in ("batch", "cfs") else name),
            {k: v.replace("+", ",") for k, v in (p.split("=", 1) for p in pairs)})


def _param_text(value) -> str:
    """A parameter as status shows it, written as in the annotation (a
    switch as ``true``/``false``: ``relaxed:boost=false``)."""
    if isinstance(value, bool):
        return str(value).lower()
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def set_policy(name: str, preset: str, params: dict[str, str]) -> None:
    attrs = "".join(f' {k}="{v}"' for k, v in params.items())
    subprocess.run(["virsh", "-c", guests.URI, "metadata", name, "--uri", guests.NAMESPACE, "--key", "cosched",
                    "--set", f'<policy name="{preset}"{attrs}/>', "--live"], check=True, capture_output=True)


def apply_mode(daemon: DaemonProcess, gs: list[guests.Guest], mode: str, settle: float) -> list[str]:
    """Put every guest under ``mode``'s preset and parameters, wait until the
    daemon has taken them up, let the guests settle (``auto``: long enough to
    choose); return the engine's notes (e.g. boost off) and errors."""
    preset, params = mode_policy(mode)
    for g in gs:
        set_policy(g.name, preset, params)

    def taken_up():
        doms = {d["name"]: d for d in (daemon.status() or {}).get("domains", [])}
        return all(g.name in doms and doms[g.name]["policy"] == preset and
                   all(_param_text(doms[g.name]["params"].get(k)) == v for k, v in params.items()) and
                   (preset in ("none", "auto") or doms[g.name].get("managed")) for g in gs)
    daemon.wait(taken_up, 10, f"guests under {mode}")
    time.sleep(settle + (AUTO_SETTLE if preset == "auto" else 0.0))
    engine = daemon.status()["daemon"]["engine"]
    return sorted({c["note"] for c in engine["cells"] if c.get("note")} |
                  {c["boost_failed"] for c in engine["cells"] if c.get("boost_failed")})


def daemon_now(daemon: DaemonProcess, gs: list[guests.Guest], signals: bool = False) -> dict:
    """What the daemon says now, in one status read: each guest's ``modes``
    (``none+slot``: left to the host scheduler, hosted in the rotation),
    the switcher's ``boosts`` so far (``made`` for these guests, and the long
    waits it held back, by why: :data:`~cosched.policy.watch.HELD`), and its
    ``observation`` source. The boost counts come with the switcher's stats,
    once a second, so a difference of two is off by up to a second's worth.
    With ``signals``, also what ``auto`` measured of each guest under it
    (``cosched explain``'s smoothed contention, idleness, spread and hazard
    per second), the evidence its choice rests on, and the ``layout`` it
    made of the host (``cosched explain``'s composition: each cell's turns,
    and the auto guests left free; None where no guest is under auto)."""
    status = daemon.status() or {}
    doms = {d["name"]: d for d in status.get("domains", [])}
    made = sum(v.get("boosts", 0) for g in gs for v in (doms.get(g.name) or {}).get("vcpus", []))
    held = status.get("daemon", {}).get("engine", {}).get("long_waits_held", {})
    def mode(d: dict) -> str | None:               # a hosted guest: none, in the rotation
        return f"{d.get('mode')}+slot" if d.get("hosted") else d.get("mode")
    out = {"modes": {g.name: mode(doms.get(g.name) or {}) for g in gs},
           "boosts": {"made": made, **{why: held.get(why, 0) for why in HELD}},
           "observation": status.get("daemon", {}).get("observation")}
    if signals:
        said = {g.name: daemon.explain(g.name) or {} for g in gs if (doms.get(g.name) or {}).get("policy") == "auto"}
        out["signals"] = {name: e.get("signals") for name, e in said.items()}
        out["layout"] = next((e["host"] for e in said.values() if e.get("host")), None)
    return out


# -- one measurement -----------------------------------------------------------
def measure(daemon: DaemonProcess, gs: list[guests.Guest], mode: str, seconds: float, truth: bool) -> dict:
    """Measure ``gs`` for ``seconds`` under ``mode`` (already applied)."""
    indexes, pids = {}, {}              # per guest, each vCPU's thread by its index (as /metrics labels it)
    for d in daemon.status()["domains"]:
        if d["name"] in {g.name for g in gs}:
            indexes[d["name"]] = {str(v["index"]): v["tid"] for v in d["vcpus"]}
            pids.update({v["tid"]: d["pid"] for v in d["vcpus"]})
    tids = {name: set(ix.values()) for name, ix in indexes.items()}
    tracing = truth and mode != "batch"
    turns: dict[str, float] = {}     # batch: each guest's turn, in its own time (batch_turn)
    cgroups = {tid: v2_cgroup(pid, tid) for tid, pid in pids.items()} if tracing else {}
    with ExitStack() as held:            # guests paused after t1 stay paused until their figures are done
        with SchedTrace(set().union(*tids.values()), cgroups, calls=True) if tracing else nullcontext() as tracer:
            if tracer:
                traced = time.monotonic()
                time.sleep(0.5)                   # events before t0 give each thread's state at t0
            state0, said0 = host_state(pids), daemon_now(daemon, gs)
            s0, c0, t0, p0 = scrape(daemon), daemon.cpu_seconds(), time.monotonic(), proc_states(pids)
            live0 = live_counters(gs) if mode != "batch" else {}
            first = {g.name: len(g.results()) for g in gs}        # counted after t0: printed inside
            if mode == "batch":
                last = {}
                with guests.paused(gs):
                    for g in gs:
                        first[g.name], last[g.name], turns[g.name] = batch_turn(g, seconds / len(gs))
            else:
                time.sleep(seconds)
                last = {g.name: len(g.results()) for g in gs}     # counted before t1: printed inside
            live1 = live_counters(gs) if live0 else {}
            s1, c1, t1, p1 = scrape(daemon), daemon.cpu_seconds(), time.monotonic(), proc_states(pids)
            state1, said1 = host_state(pids), daemon_now(daemon, gs, signals=True)
            if tracer:        # the trace is read and turned into figures with the CPUs free
                held.enter_context(guests.paused(gs))
        span = sum(turns.values()) if turns else t1 - t0
        per_guest = {}
        for g in gs:
            w = guest_window(g.results(), first[g.name], last[g.name], seconds / len(gs) if turns else span)
            if g.name in turns:                     # batch: it ran only for its turn
                w["rate"] *= turns[g.name] / span if span > 0 else 0.0
            else:
                w.update(counted(live0[g.name], live1[g.name], span, w))
            d0, d1 = s0["domains"].get(g.name, {}), s1["domains"].get(g.name, {})
            observed = d1.get("observed", 0) - d0.get("observed", 0)
            n_skew = d1.get("count", 0) - d0.get("count", 0)
            w["hazard"] = (d1.get("hazard", 0) - d0.get("hazard", 0)) / observed if observed > 0 else None
            w["skew_mean_ms"] = 1000 * (d1.get("sum", 0) - d0.get("sum", 0)) / n_skew if n_skew > 0 else None
            width = observed / n_skew if observed > 0 and n_skew > 0 else SKEW_WINDOW
            w["window_ms"] = 1000 * width        # cosched's mean sampling period (it stretches on a busy host)
            # over the sampling windows the counters cover (a scrape reads the last window
            # closed, which on a busy host ends well before it), not over the wall interval
            covered = observed if observed > 0 else t1 - t0
            w["vcpus"] = {tid: {k: (s1["vcpus"][g.name, i][k] - s0["vcpus"].get((g.name, i), {}).get(k, 0.0)) / covered
                                for k in s1["vcpus"][g.name, i]}
                          for i, tid in sorted(indexes.get(g.name, {}).items()) if (g.name, i) in s1["vcpus"]}
            if tracer:       # over the sampling windows cosched's figures cover, in windows as long as its were
                u0, u1 = d0.get("until"), d1.get("until")
                since, to = (u0, u1) if u0 is not None and u1 is not None and u0 > traced else (t0, t1)
                w["trace"] = truth_figures(tracer.events, tids[g.name], since, to, silent_states(p0, p1, t1 - t0),
                                           width, tracer.calls)
                w["trace"]["run_kernel"] = kernel_share(p0, p1, tids[g.name], t1 - t0, 1)
                w["trace"]["wait_kernel"] = kernel_share(p0, p1, tids[g.name], t1 - t0, 2)
            per_guest[g.name] = w
    lat = [(s0["hist"].get(k, []), s1["hist"].get(k, [])) for k in
           ("cosched_switch_latency_seconds_bucket", "cosched_slot_lateness_seconds_bucket")]
    return {
        "per_guest": per_guest,
        "valid": all(w["valid"] for w in per_guest.values()),
        "seconds": span,
        "wall_seconds": t1 - t0,
        "interval": [t0, t1],           # CLOCK_MONOTONIC, the clock of the trace's lines
        "switch_latency_p50_ms": _ms(quantile(0.5, *lat[0])),
        "switch_latency_p99_ms": _ms(quantile(0.99, *lat[0])),
        "slot_lateness_p99_ms": _ms(quantile(0.99, *lat[1])),
        "switches": (lat[0][1][-1][1] - (lat[0][0][-1][1] if lat[0][0] else 0)) if lat[0][1] else 0,
        "daemon_cpu_pct": 100.0 * (c1 - c0) / (t1 - t0),
        "trace_overruns": tracer.overruns if tracer else None,
        "host_state": {"start": state0, "end": state1},
        "modes": {"start": said0["modes"], "end": said1["modes"]},
        "auto_signals": said1["signals"],
        "layout": said1["layout"],
        "boosts": {k: said1["boosts"][k] - said0["boosts"][k] for k in said0["boosts"]},
        "observation": said1["observation"],
    }


def batch_turn(g: guests.Guest, share: float) -> tuple[int, int, float]:
    """Run paused guest ``g`` alone until its result lines span ``share``
    seconds of its own time, then pause it again: ``(first, last, seconds)``,
    the lines of the turn and the guest time between them. The time from
    resume to its first line, and after the line that completes the turn,
    is not counted (nor is the harness's console reading). A guest that
    does not get there within ``3 * share + 5`` s ends its turn short, and
    its coverage then says so."""
    first = len(g.results())
    g.dom.resume()
    deadline = time.monotonic() + 3 * share + 5
    try:
        rs = g.results()
        while time.monotonic() < deadline and (
                len(rs) <= first or rs[-1]["t_ms"] - rs[first]["t_ms"] < share * 1000):
            time.sleep(0.02)
            rs = g.results()
    finally:
        g.dom.suspend()
    last = len(rs)
    return first, last, (rs[last - 1]["t_ms"] - rs[first]["t_ms"]) / 1000 if last > first + 1 else 0.0


# -- /proc, read here and nowhere else in the benchmark (not through cosched's parsers) --
def _task(pid: int, tid: int, name: str) -> str:
    with open(f"/proc/{pid}/task/{tid}/{name}") as f:
        return f.read()


def proc_states(pids: dict[int, int]) -> dict[int, tuple[bool, int, int]]:
    """``{tid: (runnable, run ns, wait ns)}``: the state letter after the command name in
    ``stat`` (``R`` runnable or running) and the first two fields of ``schedstat``."""
    out = {}
    for tid, pid in pids.items():
        try:
            stat, schedstat = _task(pid, tid, "stat"), _task(pid, tid, "schedstat").split()
            out[tid] = (stat[stat.rindex(")") + 2] == "R", int(schedstat[0]), int(schedstat[1]))
        except (OSError, IndexError, ValueError):
            pass                        # the thread is gone
    return out


def kernel_share(before: dict, after: dict, tids: set[int], span: float, field: int = 1) -> dict[int, float]:
    """Each thread's run time (``field`` 1) or wait for a CPU (2) over the
    span as the kernel bills it (``schedstat``, from :func:`proc_states` at
    both ends), as a share of the span: a check on the trace's own ``run``
    and ``wait``, which a lost or hidden switch would make wrong."""
    return {tid: (after[tid][field] - before[tid][field]) / 1e9 / span
            for tid in sorted(tids) if tid in before and tid in after and span > 0}


def v2_cgroup(pid: int, tid: int) -> str | None:
    """The thread's cgroup v2 path, None when it is gone."""
    try:
        return _v2_path(_task(pid, tid, "cgroup").split())
    except OSError:
        return None


def _v2_path(cgroup_lines: list[str]) -> str | None:
    return next((c[3:] for c in cgroup_lines if c.startswith("0::")), None)


def host_state(pids: dict[int, int]) -> dict[str, dict]:
    """Each vCPU thread's affinity, scheduling policy, priority and nice, and cgroups
    (every hierarchy, with its v2 ``cgroup.freeze``), keyed by TID."""
    v2 = guests.cgroup_mounts()[0]
    out = {}
    for tid, pid in pids.items():
        try:
            status = _task(pid, tid, "status")
            cgroups = _task(pid, tid, "cgroup").split()
            policy = os.sched_getscheduler(tid)
            prio = os.sched_getparam(tid).sched_priority
            nice = os.getpriority(os.PRIO_PROCESS, tid)
        except (OSError, ValueError):
            continue
        m = re.search(r"^Cpus_allowed_list:\s*(\S+)", status, re.M)
        v2_path = _v2_path(cgroups)
        freeze = None
        if v2_path:
            try:
                freeze = open(f"{v2}{v2_path}/cgroup.freeze").read().strip()
            except OSError:
                pass
        out[str(tid)] = {"affinity": m.group(1) if m else None, "policy": policy, "priority": prio, "nice": nice,
                         "cgroups": cgroups, "freeze": freeze}
    return out


def silent_states(before: dict, after: dict, span: float) -> dict[int, str]:
    """The state of threads the trace may say nothing about (a running one
    shows in its ticks, so this is for waiting or sleeping ones): runnable
    at both ends and run for most of the span means running, runnable with
    no run time means waiting, anything else sleeping."""
    out = {}
    for tid, (r0, run0, _) in before.items():
        r1, run1, _ = after.get(tid, (False, run0, 0))
        if r0 and r1:
            out[tid] = RUNNING if (run1 - run0) / 1e9 > span / 2 else RUNNABLE
        else:
            out[tid] = SLEEPING
    return out


def truth_figures(events, tids: set[int], t0: float, t1: float, silent: dict[int, str],
                  width: float = SKEW_WINDOW, calls: list | None = None) -> dict:
    """Exact hazard fraction, share of the interval all its vCPUs ran at once
    (``together``) and mean skew over windows of ``width`` seconds of one guest from a trace,
    its hazard episodes and how soon boosts answered them (``calls``: see
    :func:`benchmarks.stats.episode_figures`), and ``reconstructed``: the
    share of its threads' time over the interval whose state no event showed
    (implied by a later event, or read from /proc for a thread with none)."""
    lines = timelines(events, states_at(events, tids, t0, silent), t0, t1, frozen_at(events, tids, t0))
    f = trace_figures(lines)
    skews = window_skews(lines, t0, t1, width)
    span = t1 - t0
    return {"hazard": f["hazard"] / span, "partial": f["partial"] / span, "together": f["together"] / span,
            **{k: {t: v / span for t, v in f[k].items()} for k in ("run", "wait", "frozen")},
            "skew_mean_ms": 1000 * sum(skews) / len(skews) if skews else None,
            "episodes": episode_figures(hazard_episodes(lines, calls or [])),
            "reconstructed": sum(reconstructed(events, tids, t0, t1).values()) / (span * len(tids)),
            "events": sum(1 for e in events if e.tid in tids)}


# -- the suite -----------------------------------------------------------------
class Record:
    """``results.json`` of one suite, rewritten after every run it is given."""

    def __init__(self, path: Path, head: dict):
        self.path, self.head, self.runs = path, head, []
        self.sitting = 0

    @classmethod
    def resume(cls, path: Path, sizes: dict[str, int]) -> "Record":
        """The record of a stopped suite, holding the runs of its finished
        units (``sizes``: unit -> runs it takes); the others' runs are moved
        to ``superseded``."""
        res = json.loads(path.read_text())
        if res.get("commit") != commit():
            raise SystemExit(f"{path}: the suite began at commit {res.get('commit')}, this checkout is at "
                             f"{commit()}: resume it from a checkout of that commit")
        rec = cls(path, {k: v for k, v in res.items() if k not in ("complete", "ideal", "runs")})
        count: dict[str, int] = {}
        for r in res["runs"]:
            count[r.get("unit")] = count.get(r.get("unit"), 0) + 1
        done = {u for u, n in count.items() if u in sizes and n == sizes[u]}
        rec.runs = [r for r in res["runs"] if r.get("unit") in done]
        rec.head["superseded"] = res.get("superseded", []) + [r for r in res["runs"] if r.get("unit") not in done]
        rec.head["sittings"] = res.get("sittings", [res.get("started")]) + [time.strftime("%Y-%m-%d %H:%M:%S")]
        rec.sitting = len(rec.head["sittings"]) - 1
        return rec

    def units(self) -> set[str]:
        return {r["unit"] for r in self.runs}

    def append(self, run: dict) -> None:
        self.runs.append({**run, "sitting": self.sitting})
        self.write(complete=False)

    def write(self, complete: bool) -> dict:
        alone: dict[str, list[float]] = {}
        for r in self.runs:
            if r["mode"] == "alone" and r.get("ideal"):
                alone.setdefault(r["workload"], []).append(r["ideal"])
        res = {**self.head, "complete": complete, "ideal": {wl: sum(v) / len(v) for wl, v in alone.items()},
               "runs": self.runs}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(res, indent=1))
        tmp.replace(self.path)             # a reader never sees half a file
        return res


class Progress:
    def __init__(self, total: int):
        self.total, self.done, self.start = total, 0, time.monotonic()

    def step(self, text: str) -> None:
        self.done += 1
        el = time.monotonic() - self.start
        left = el / self.done * (self.total - self.done)
        print(f"[{self.done}/{self.total} {el / 60:.1f} min, ~{left / 60:.1f} min left] {text}", flush=True)


def boot(name: str, workload: str, vcpus: int, img) -> guests.Guest:
    """Boot one guest running ``workload``: a synthetic one with its options
    (``ep threads=1``), or a name in :data:`SOFTWARE`, on the image that
    carries it."""
    memory = {}
    if workload in SOFTWARE:
        workload, img, memory = SOFTWARE[workload], image.build_software(), {"memory_mib": 256}
    first, _, rest = workload.partition(" ")
    g = guests.start(name, vcpus=vcpus, workload=f"{first} interval_ms={REPORT_MS} {rest}".strip(), image=img, **memory,
                     policy=guests.annotation("none"))
    g.wait_for("cosched-result", timeout=120 if memory else 60)     # the larger image unpacks slowly
    return g


def boot_set(workloads: list[str], vcpus: int, img, gs: list[guests.Guest] | None = None) -> list[guests.Guest]:
    """Boot one guest per workload after those in ``gs`` (appended to it),
    each with the running ones paused: busy guests under the host scheduler
    can starve a booting one."""
    gs = [] if gs is None else gs
    for wl in workloads:
        with guests.paused(gs):
            gs.append(boot(f"{PREFIX}{len(gs)}", wl, vcpus, img))
    return gs


@contextmanager
def under_mode(workloads: list[str], mode: str, vcpus: int = 2):
    """For a one-off measurement: one guest per workload, booted as
    :func:`boot_set` does, and a daemon of its own with every guest under
    ``mode`` (a preset). Yields ``(daemon, guests)``; the daemon is stopped
    and the guests destroyed afterwards."""
    gs = []
    try:
        boot_set(workloads, vcpus, image.build(), gs)
        with tempfile.TemporaryDirectory() as tmp:
            daemon = DaemonProcess(Path(tmp)).start()
            try:
                for g in gs:
                    set_policy(g.name, mode, {})
                yield daemon, gs
            finally:
                daemon.stop()
    finally:
        for g in gs:
            g.destroy()


def in_turn(modes: list[str], rep: int) -> list[str]:
    """The order of the modes in repetition ``rep``: as given in even
    repetitions, reversed in odd ones. This host drifts from minute to
    minute, and a mode always measured last (after the others and their
    settling) paid for it: ``auto`` ran gang's very plan at 0.43-0.75x gang
    as the last mode of a repetition and 1.03-1.28x when measured first
    (``docs/decisions/0018-suite-run-length-and-mode-order.md``). Over each pair of
    repetitions every mode has the same mean position."""
    return list(reversed(modes)) if rep % 2 else list(modes)


def units(args) -> dict[str, int]:
    """Every unit of the suite ``args`` asks for, and how many runs it takes."""
    out = {f"{wl} x{n}": args.reps * (1 + len(args.modes)) for wl in args.workloads for n in args.guests}
    out.update({f"mixed {row}": mixed_reps(args) * len([m for m in args.modes if m != "batch"]) for row in args.mixed})
    out.update({steady_unit(wl, n): 1 for wl in args.workloads for n in args.guests if args.steady})
    return {**out, **({"phases": len(PHASE_MODES)} if args.phases else {})}


def steady_unit(workload: str, n: int) -> str:
    return f"steady {workload} x{n}"


def mixed_reps(args) -> int:
    return args.mixed_reps or args.reps


def run_mixed(args, daemon, img, progress, runs) -> None:
    """Guests of different workloads on one host: each alone (the others
    paused), then all together under cfs, each static policy and auto."""
    for row in args.mixed:
        if f"mixed {row}" in runs.units():
            continue
        wls = MIXED[row]
        n = len(wls)
        gs = boot_set(list(wls), args.vcpus, img)
        daemon.wait(lambda: all(daemon.domain(g.name) for g in gs), 10, "guests observed")
        for rep in range(mixed_reps(args)):
            apply_mode(daemon, gs, "cfs", args.settle)
            alone, demand = {}, {}      # each guest alone: its rate, and the CPUs its vCPUs kept busy
            for g in gs:
                for attempt in range(1 + args.retries):
                    with guests.paused([o for o in gs if o is not g]):
                        r = measure(daemon, [g], "alone", args.seconds, False)
                    if r["valid"]:
                        break
                alone[g.name] = r["per_guest"][g.name]["rate"] if r["valid"] else None
                demand[g.name] = (sum(v["run"] for v in r["per_guest"][g.name]["vcpus"].values())
                                  if r["valid"] else None)
            for mode in in_turn([m for m in args.modes if m != "batch"], rep):
                notes = apply_mode(daemon, gs, mode, args.settle)
                for attempt in range(1 + args.retries):
                    r = measure(daemon, gs, mode, args.seconds, False)
                    if r["valid"]:
                        break
                r.update(workload="mixed", unit=f"mixed {row}", guests=n, mode=mode, rep=rep, ideal=None, notes=notes,
                         attempts=attempt + 1, alone=alone, alone_cpus=demand, cpus=len(os.sched_getaffinity(0)),
                         guest_workloads={g.name: w for g, w in zip(gs, wls)}, held_out=row in HELD_OUT)
                runs.append(r)
                rel = [r["per_guest"][g.name]["rate"] / alone[g.name] for g in gs if alone[g.name]]
                progress.step(f"mixed {row} {mode} rep {rep + 1}: " + (
                    f"sum of relative throughputs {sum(rel):.2f}" if r["valid"] else "INVALID"))
        guests.destroy_all(PREFIX)


def run_phases(args, daemon, img, progress, runs) -> None:
    """Guests alternating barrier and blocking phases, under cfs, gang, boost
    and auto: per-phase throughput, and how long auto takes to follow."""
    if "phases" in runs.units():
        return
    gs = boot_set([f"phases phase_ms={PHASE_MS}"] * 2, args.vcpus, img)
    daemon.wait(lambda: all(daemon.domain(g.name) for g in gs), 10, "guests observed")
    for mode in PHASE_MODES:
        apply_mode(daemon, gs, mode, args.settle)
        timeline = mode_timeline(daemon, gs, args.phases, lines=True)
        per_guest = {g.name: phase_figures(g.results(), timeline, g.name) for g in gs}
        runs.append({"workload": "phases", "unit": "phases", "guests": len(gs), "mode": mode, "rep": 0, "valid": True,
                     "ideal": None, "seconds": args.phases, "phase_ms": PHASE_MS, "per_guest": per_guest})
        progress.step(f"phases {mode}: " + ", ".join(
            f"{p['kind']} {p['rate']:.0f}/s" for p in next(iter(per_guest.values()))["phases"][:4]))
    guests.destroy_all(PREFIX)


def mode_timeline(daemon: DaemonProcess, gs: list[guests.Guest], seconds: float, lines: bool = False) -> list:
    """Each guest's mode as status shows it, every 0.25 s for ``seconds``:
    ``[(host seconds since the start, {guest: result lines so far} (with
    ``lines``, else empty), {guest: mode})]``. ``auto`` changes a guest's
    mode no more often than its dwell time (seconds), so no change falls
    between two reads unseen."""
    timeline = []
    start = time.monotonic()
    while (t := time.monotonic() - start) < seconds:
        timeline.append((t, {g.name: len(g.results()) for g in gs} if lines else {}, daemon_now(daemon, gs)["modes"]))
        time.sleep(0.25)
    return timeline


STEADY_GAP_S = 1.0        # a steady run is valid when status was read at least this often, with every mode known


def steady_figures(timeline: list, name: str, seconds: float) -> dict:
    """One guest's modes over a steady run's timeline: each change (when,
    from, to), the seconds each mode was shown (from one read to the next;
    the last read holds to the end), and whether the reads covered the
    interval: no gap longer than :data:`STEADY_GAP_S` (from its start,
    between reads, to its end) and a mode known at every read."""
    modes = [m[name] for _, _, m in timeline]
    reads = [t for t, _, _ in timeline]
    held: dict = {}
    for m, a, b in zip(modes, [0.0] + reads[1:], reads[1:] + [seconds]):    # the first read's from the start
        held[m] = held.get(m, 0.0) + max(b - a, 0.0)
    changes = [{"t": t, "old": a, "new": b} for t, a, b in zip(reads[1:], modes, modes[1:]) if a != b]
    bounds = [0.0, *reads, seconds]
    covered = bool(modes) and all(modes) and max(b - a for a, b in zip(bounds, bounds[1:])) <= STEADY_GAP_S
    return {"changes": changes, "held_s": {str(k): v for k, v in held.items()}, "covered": covered}


def run_steady(args, daemon: DaemonProcess, gs: list[guests.Guest], wl: str, progress, runs) -> None:
    """Guests of one workload under ``auto`` for ``--steady`` seconds after
    it had :data:`AUTO_SETTLE` to choose: how often it changes a steady
    guest's mode (target: at most once a minute)."""
    apply_mode(daemon, gs, "auto", args.settle)
    timeline = mode_timeline(daemon, gs, args.steady)
    per_guest = {g.name: steady_figures(timeline, g.name, args.steady) for g in gs}
    runs.append({"workload": "steady", "unit": steady_unit(wl, len(gs)), "steady_workload": wl, "guests": len(gs),
                 "mode": "auto", "rep": 0, "valid": all(p["covered"] for p in per_guest.values()), "ideal": None,
                 "seconds": args.steady, "gap_s": STEADY_GAP_S, "per_guest": per_guest})
    most = max(len(p["changes"]) for p in per_guest.values())
    shown = sorted({m for p in per_guest.values() for m in p["held_s"]})
    progress.step(f"steady {wl} x{len(gs)} auto: {', '.join(shown)}, at most {most} change(s) per guest "
                  f"in {args.steady:g} s")


def phase_figures(results: list[dict], timeline: list, name: str, phase_ms: float = PHASE_MS) -> dict:
    """One guest's phases seen in a timeline: each complete phase's kind,
    rate, coverage (the guest time its first and last result lines span, over
    the phase's length: its rate is measured over that span) and, where the
    daemon changed this guest's mode during it, when."""
    first = timeline[0][1][name]        # lines printed before the run are not its own
    seen_at = []                        # host time by which result line first + i had appeared
    for t, counts, _ in timeline:
        seen_at += [t] * (counts[name] - first - len(seen_at))
    lines = results[first:first + len(seen_at)]
    phases, i = [], 0
    while i < len(lines):
        j = i
        while j < len(lines) and lines[j]["phase"] == lines[i]["phase"]:
            j += 1
        if i > 0 and j < len(lines):    # complete phases only: begun and ended in the timeline
            a, b = lines[i], lines[j - 1]
            t0, t1 = seen_at[i], seen_at[j - 1]
            modes = [(t, m[name]) for t, _, m in timeline if t0 <= t <= t1]
            settled = modes[-1][1] if modes else None
            follow = next((t - t0 for t, m in modes if m == settled), None)
            phases.append({"kind": "barrier" if a["phase"] % 2 == 0 else "blocking",
                           "rate": (b["iters"] - a["iters"]) * 1000.0 / max(b["t_ms"] - a["t_ms"], 1),
                           "coverage": (b["t_ms"] - a["t_ms"]) / phase_ms,
                           "start_s": t0, "mode_before": (modes[0][1] if modes else None), "mode_settled": settled,
                           "follow_s": follow if modes and modes[0][1] != settled else 0.0})
        i = j
    return {"phases": phases}


def run(args, out: Path, resume: bool = False) -> dict:
    """Run the suite; every finished run is in ``out/results.json`` at once
    (:class:`Record`). ``resume``: go on with the suite stopped there."""
    img = image.build()
    services.ensure()
    guests.destroy_all(PREFIX)
    counts = sorted(args.guests)
    planned = units(args)
    if resume:
        runs = Record.resume(out / "results.json", planned)
        progress = Progress(sum(n for u, n in planned.items() if u not in runs.units()))
        print(f"resuming: {len(runs.runs)} runs of {len(runs.units())} finished units kept", flush=True)
        return _run(args, img, counts, runs, progress)
    progress = Progress(sum(planned.values()))
    runs = Record(out / "results.json", {
        "host": {"cpus": len(os.sched_getaffinity(0)), "kernel": platform.release(),
                 "domain_type": guests.domain_type(), "python": platform.python_version(),
                 "cpu_model": _cpu_model()},
        "config": {"guests": counts, "vcpus": args.vcpus, "workloads": list(args.workloads),
                   "modes": list(args.modes), "seconds": args.seconds, "reps": args.reps, "truth": args.truth,
                   "retries": args.retries, "min_coverage": MIN_COVERAGE, "report_ms": REPORT_MS,
                   "mixed": list(args.mixed), "phases_seconds": args.phases, "steady_seconds": args.steady,
                   "auto_settle": AUTO_SETTLE, "meter": args.meter},
        "command": " ".join(["python -m benchmarks.suite", *sys.argv[1:]]), "commit": commit(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"), "planned": progress.total})
    return _run(args, img, counts, runs, progress)


def _run(args, img, counts: list[int], runs: Record, progress: Progress) -> dict:
    daemon = DaemonProcess(Path(tempfile.mkdtemp(prefix="cosched-bench-")),
                           extra_config=f'meter = "{args.meter}"\n').start()
    try:
        for wl in args.workloads:
            gs: list[guests.Guest] = []
            for n in counts:
                swept = f"{wl} x{n}" in runs.units()
                steady = args.steady and steady_unit(wl, n) not in runs.units()
                if swept and not steady:
                    continue
                boot_set([wl] * (n - len(gs)), args.vcpus, img, gs)
                daemon.wait(lambda: all(daemon.domain(g.name) for g in gs), 10, "guests observed")
                for rep in range(0 if swept else args.reps):
                    ideal = None
                    for mode in ("alone", *in_turn(args.modes, rep)):
                        notes = apply_mode(daemon, gs, "cfs" if mode == "alone" else mode, args.settle)
                        for attempt in range(1 + args.retries):   # an invalid run is measured again
                            if mode == "alone":         # the ideal, measured next to what it normalises
                                with guests.paused(gs[1:]):
                                    r = measure(daemon, gs[:1], mode, args.seconds, args.truth)
                            else:
                                r = measure(daemon, gs, mode, args.seconds, args.truth)
                            if r["valid"]:
                                break
                        if mode == "alone":
                            ideal = r["per_guest"][gs[0].name]["rate"] if r["valid"] else None
                        r.update(workload=wl, unit=f"{wl} x{n}", guests=1 if mode == "alone" else n, mode=mode, rep=rep,
                                 ideal=ideal, notes=notes, attempts=attempt + 1)
                        runs.append(r)
                        total = sum(g["rate"] for g in r["per_guest"].values())
                        low = min(g["coverage"] for g in r["per_guest"].values())
                        progress.step(f"{wl} x{n} {mode} rep {rep + 1}: "
                                      + (f"INVALID after {attempt + 1} attempts (coverage {100 * low:.0f}%)"
                                         if not r["valid"] else f"{total:.1f} iterations/s" if mode == "alone" else
                                         f"{100 * total / ideal:.0f}% of ideal" if ideal else "no valid ideal"))
                if steady:
                    run_steady(args, daemon, gs, wl, progress, runs)
            guests.destroy_all(PREFIX)
        if args.mixed:
            run_mixed(args, daemon, img, progress, runs)
        if args.phases:
            run_phases(args, daemon, img, progress, runs)
    finally:
        rc = daemon.stop()
        guests.destroy_all(PREFIX)
    if rc != 0:
        raise RuntimeError(f"daemon exited {rc}:\n{daemon.log.read_text()[-3000:]}")
    return runs.write(complete=True)


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def _list(choices, digits: str = ""):
    """A comma-separated list of ``choices``; with ``digits``, a bare number
    stands for that prefix and the number (``3`` for ``x3``)."""
    def parse(text: str) -> list[str]:
        items = [digits + s if digits and s.isdigit() else s for s in text.split(",") if s]
        bad = [s for s in items if choices and s not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown: {', '.join(bad)} (choose from {', '.join(choices)})")
        return items
    return parse


def _modes(text: str) -> list[str]:
    modes = _list(None)(text)
    for m in modes:
        try:
            mode_policy(m)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return modes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--guests", type=lambda s: [int(x) for x in s.split(",")], default=[2, 3, 4],
                    help="guest counts to run together (comma-separated)")
    ap.add_argument("--vcpus", type=int, default=2, help="vCPUs per guest")
    ap.add_argument("--workloads", type=_list(WORKLOADS), default=list(WORKLOADS))
    ap.add_argument("--modes", type=_modes, default=list(MODES),
                    help="batch, cfs, and cosched presets (gang, partial, boost, or a site preset), each "
                         "with parameters if wanted (boost:pause-ms=0)")
    ap.add_argument("--seconds", type=float, default=6.0, help="measurement interval per run")
    ap.add_argument("--settle", type=float, default=1.5, help="wait after a mode change")
    ap.add_argument("--meter", choices=METER_MODES, default=Config.meter,
                    help=f"the daemon's meter setting (default: the daemon's, {Config.meter}): its figures from "
                         "the in-kernel meter (auto) or from /proc samples (off)")
    ap.add_argument("--reps", type=int, default=2, help="repetitions of every mode")
    ap.add_argument("--retries", type=int, default=2, help="measure an invalid run again, up to this many times")
    ap.add_argument("--no-truth", dest="truth", action="store_false",
                    help="skip the kernel-trace comparison of cosched's hazard and skew")
    ap.add_argument("--mixed", type=_list(MIXED, digits="x"), default=[],
                    help="mixed hosts to run, by name; a guest count names the sleeper rows (" +
                         ", ".join(f"{k}: {'+'.join(v)}" for k, v in MIXED.items()) + ")")
    ap.add_argument("--mixed-reps", type=int, default=0, help="repetitions of each mixed host (default: --reps)")
    ap.add_argument("--phases", type=float, default=0.0, metavar="SECONDS",
                    help=f"run two guests alternating barrier and blocking ({PHASE_MS // 1000} s each) "
                         "under cfs, gang, boost and auto for SECONDS each")
    ap.add_argument("--steady", type=float, default=0.0, metavar="SECONDS",
                    help="after each workload's repetitions, on the same guests: auto for SECONDS, counting "
                         "how often it changes a steady guest's mode")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--resume", type=Path, default=None, metavar="DIR",
                    help="go on with the suite stopped in DIR, with the command it recorded")
    args = ap.parse_args(argv)
    resume = args.resume
    if resume:
        res = json.loads((resume / "results.json").read_text())
        if res.get("complete"):
            ap.error(f"{resume} holds a finished suite")
        args = ap.parse_args(res["command"].split()[3:])
    if os.geteuid() != 0:
        ap.error("run as root: it starts guests, the daemon and kernel tracing")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))     # clean up guests, daemon and trace
    out = resume or args.out or Path("benchmarks/results") / time.strftime("suite-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    print(f"results in {out}/results.json, written after every run", flush=True)
    res = run(args, out, resume=resume is not None)
    text = report.write(res, out)
    print("\n" + text + f"\nwritten to {out}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
