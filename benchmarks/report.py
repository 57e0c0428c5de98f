"""Tables and plots from a suite run's ``results.json``.

    python -m benchmarks.report RESULTS_DIR      # re-draws summary.md and the PNGs

:func:`aggregate` groups the raw runs by workload, guest count and mode
(repetitions and guests pooled); :func:`summary` renders the tables;
:func:`plots` draws (matplotlib, no display needed):

``throughput.png``        aggregate throughput relative to the ideal, per guest count
``missed_deadlines.png``  the deadline workload's missed chunks against guest count
``iteration_cdf.png``     CDF of iteration times at the largest guest count
``fairness.png``          Jain's index across guests
``hazard.png``            cosched's concurrency-hazard fraction
``overhead.png``          the daemon's CPU time
``truth.png``             cosched's hazard against the exact one from kernel traces
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from collections import Counter
from math import prod
from statistics import mean, median, pstdev

from benchmarks.stats import hist_add, hist_cdf, hist_quantile, jain, nearest_rank
from cosched.policy.watch import HELD

TRUTH_TARGET_PP = 5.0


def _median(values):
    values = [v for v in values if v is not None]
    return median(values) if values else None


def _mean(values):
    values = [v for v in values if v is not None]
    return mean(values) if values else None


def _max(values):
    values = list(values)
    return max(values) if values else None


SCENARIOS = ("mixed", "phases", "steady")      # runs with their own tables, not normalised by one ideal


def _sweep(res: dict) -> list[dict]:
    return [r for r in res["runs"] if r["workload"] not in SCENARIOS]


def invalid_runs(res: dict) -> dict[tuple, int]:
    """``{(workload, guests, mode): runs left out}``: invalid (coverage), or without a valid ideal."""
    out: dict[tuple, int] = {}
    for r in _sweep(res):
        if not r.get("valid", True) or (r["mode"] != "alone" and not r.get("ideal")):
            key = (r["workload"], r["guests"], r["mode"])
            out[key] = out.get(key, 0) + 1
    return out


def aggregate(res: dict) -> dict:
    """``{(workload, guests, mode): figures}`` over the valid repetitions and guests."""
    groups: dict[tuple, list[dict]] = {}
    invalid: dict[tuple, int] = {}
    for r in _sweep(res):
        key = (r["workload"], r["guests"], r["mode"])
        if r.get("valid", True) and (r["mode"] == "alone" or r.get("ideal")):
            groups.setdefault(key, []).append(r)
        else:                       # never averaged in: counted and shown
            invalid[key] = invalid.get(key, 0) + 1
    out = {}
    for (wl, n, mode), rs in groups.items():
        of_ideal = [sum(g["rate"] for g in r["per_guest"].values()) / r["ideal"] if r.get("ideal") else 0.0
                    for r in rs]
        gs = [g for r in rs for g in r["per_guest"].values()]
        iters = sum(g["iters"] for g in gs)
        errors = [100 * abs(g["hazard"] - g["trace"]["hazard"]) for g in gs
                  if g.get("trace") and g.get("hazard") is not None]
        out[(wl, n, mode)] = {
            "invalid": invalid.get((wl, n, mode), 0),
            "of_ideal": of_ideal,
            "jain": _mean([jain([g["rate"] for g in r["per_guest"].values()]) for r in rs]) if n > 1 else 1.0,
            "missed_pct": 100 * sum(g["missed"] for g in gs) / iters if iters else None,
            "hist": hist_add(*(g["hist"] for g in gs)),
            "hazard": _mean([g["hazard"] for g in gs]),
            "trace_hazard": _mean([g["trace"]["hazard"] for g in gs if g.get("trace")]),
            "skew_ms": _mean([g["skew_mean_ms"] for g in gs]),
            "trace_skew_ms": _mean([g["trace"]["skew_mean_ms"] for g in gs if g.get("trace")]),
            "reconstructed": _mean([g["trace"].get("reconstructed") for g in gs if g.get("trace")]),
            "together": _mean([g["trace"].get("together") for g in gs if g.get("trace")]),
            "independent": _mean([prod(g["trace"]["run"].values()) for g in gs if g.get("trace")]),
            "episodes": _episodes([g["trace"]["episodes"] for g in gs if (g.get("trace") or {}).get("episodes")]),
            "truth_err_pp": _mean(errors),
            "truth_err_max_pp": _max(errors),
            "trace_off_pp": _max([100 * abs(g["trace"]["run"][t] - k) for g in gs if g.get("trace")
                                  for t, k in g["trace"].get("run_kernel", {}).items() if t in g["trace"]["run"]]),
            "cpu_pct": _mean([r["daemon_cpu_pct"] for r in rs]),
            "switch_p50_ms": _mean([r.get("switch_latency_p50_ms") for r in rs]),
            "switch_p99_ms": _mean([r.get("switch_latency_p99_ms") for r in rs]),
            "lateness_p99_ms": _mean([r.get("slot_lateness_p99_ms") for r in rs]),
            "notes": sorted({n for r in rs for n in r.get("notes", [])}),
            "overruns": sum(r.get("trace_overruns") or 0 for r in rs),
            # runs recorded before the switcher counted them lack these
            **{f"boosts_{k}": sum(r["boosts"][k] for r in rs) if all(k in r.get("boosts", {}) for r in rs) else None
               for k in ("made", *HELD)},
        }
    return out


def _pct(v, digits=0):
    return "-" if v is None else f"{100 * v:.{digits}f}%"


def _num(v, fmt="{:.2f}"):
    return "-" if v is None else fmt.format(v)


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]


def summary(res: dict, agg: dict | None = None) -> str:
    agg = agg or aggregate(res)
    left_out = invalid_runs(res)
    h, c = res["host"], res["config"]
    modes, counts, wls = c["modes"], c["guests"], c["workloads"]
    top = max(counts)
    lines = [
        "# Co-scheduling benchmark", "",
        f"Host: {h['cpus']} CPUs ({h.get('cpu_model', '?')}), kernel {h['kernel']}, guests as domain type "
        f"`{h['domain_type']}` ({'TCG' if h['domain_type'] == 'qemu' else 'KVM'}). "
        f"{c['vcpus']} vCPUs per guest, {c['seconds']:g} s per run, {c['reps']} repetition(s) of every mode.", "",
        f"Command: `{res['command']}`" + (f", at commit {res['commit']}." if res.get("commit") else ""), "",
        *([f"**Incomplete:** the suite stopped after {len(res['runs'])} of {res.get('planned', '?')} runs; "
           "the tables hold those.", ""] if res.get("complete") is False else []),
        *([f"Measured in {len(res['sittings'])} sittings ({', '.join(map(str, res['sittings']))}): the suite "
           "was stopped and resumed; each unit (a workload at one guest count, a mixed host, the phase runs) "
           "was measured whole in one sitting.", ""] if len(res.get("sittings", [])) > 1 else []),
        "## Throughput relative to the ideal", "",
        "Aggregate iterations per second of all guests, divided by the first guest's alone with the "
        "others paused, measured in the same repetition (mean over repetitions, min–max in brackets). "
        "Each guest's iterations over exactly the interval, from its live counters read from its memory "
        "at the interval's two ends (in batch, from the result lines it printed in its turn). "
        f"Only valid runs count: every guest's measurement spans at least "
        f"{100 * c.get('min_coverage', 0.9):.0f}% of the interval; a run that is not is measured again "
        f"(up to {c.get('retries', 0)} times) and, if it stays invalid, left out and counted in square "
        "brackets.", "",
    ]
    rows = []
    for wl in wls:
        for n in counts:
            row = [wl, str(n)]
            for m in modes:
                a = agg.get((wl, n, m))
                bad = left_out.get((wl, n, m), 0)
                cell = "-" if not a else f"{_pct(mean(a['of_ideal']))} ({_pct(min(a['of_ideal']))}–{_pct(max(a['of_ideal']))})"
                row.append(cell + (f" [{bad} invalid]" if bad else ""))
            rows.append(row)
    lines += _table(["workload", "guests", *modes], rows)
    if "deadline" in wls:
        lines += ["", "## Missed deadlines (deadline workload)", "",
                  "Percentage of ~100 ms chunks a thread finished while a sibling had not finished the "
                  "previous one (the Xen paper's skew microbenchmark).", ""]
        alone = agg.get(("deadline", 1, "alone"))
        rows = [["1 (alone)"] + [_num(alone and alone["missed_pct"], "{:.1f}%")] * len(modes)]
        rows += [[str(n)] + [_num((agg.get(("deadline", n, m)) or {}).get("missed_pct"), "{:.1f}%") for m in modes]
                 for n in counts]
        lines += _table(["guests", *modes], rows)
    lines += ["", f"## Iteration times at {top} guests (p50 / p99, ms)", "",
              "Time between a thread's successive iterations, from the guests' histograms "
              "(upper bounds of buckets 14–25% wide).", ""]
    rows = []
    for wl in wls:
        row = [wl]
        for m in ["alone", *modes]:
            a = agg.get((wl, 1 if m == "alone" else top, m))
            hist = a["hist"] if a else {}
            row.append("-" if not hist else f"{1000 * hist_quantile(hist, 0.5):.3g} / {1000 * hist_quantile(hist, 0.99):.3g}")
        rows.append(row)
    lines += _table(["workload", "alone", *modes], rows)
    lines += ["", f"## Fairness and concurrency hazard at {top} guests", "",
              "Jain's index of the guests' throughputs (1 = equal), and cosched's concurrency-hazard "
              "fraction (time some vCPU ran while a sibling waited, over time observed; mean over guests).", ""]
    rows = [[wl] + [(lambda a: "-" if not a else f"{a['jain']:.2f} / {_pct(a['hazard'], 1)}")(agg.get((wl, top, m)))
                    for m in modes] for wl in wls]
    lines += _table(["workload (Jain / hazard)", *modes], rows)
    lines += ["", "## Daemon overhead and switching", "",
              "CPU time of the daemon and its switcher process in percent of one CPU, and the switch "
              "loop's figures from the daemon's own histograms (mean over runs), interpolated within "
              "buckets 0.1–0.25 ms wide below 1 ms and 1–3 ms wide from 1 to 5 ms: read them to about "
              "0.1 ms.", ""]
    rows = []
    for m in modes:
        a = [v for (wl, n, mm), v in agg.items() if mm == m]
        rows.append([m, _num(_mean([x["cpu_pct"] for x in a]), "{:.1f}"),
                     _num(_mean([x["switch_p50_ms"] for x in a]), "{:.1f}"),
                     _num(_mean([x["switch_p99_ms"] for x in a]), "{:.1f}"),
                     _num(_mean([x["lateness_p99_ms"] for x in a]), "{:.1f}")])
    lines += _table(["mode", "daemon CPU %", "switch p50 ms", "switch p99 ms", "slot lateness p99 ms"], rows)
    if c.get("truth"):
        lines += ["", "## Metric truth: cosched against kernel traces", "",
                  "For every run but batch, the kernel's scheduler events of the vCPU threads "
                  "(switches, wake-ups, run-time ticks) and the freezes and thaws of their cgroups were "
                  "recorded over the same interval and turned into the exact hazard fraction and 10 ms "
                  "window skew (lag = waiting or frozen, as cosched counts it). Error: |cosched − trace| "
                  f"in percentage points, mean and worst over guests (target: within {TRUTH_TARGET_PP:g} "
                  "points). Reconstructed: the share of the threads' time whose state no event showed "
                  "(implied by a later event, or read from /proc for a thread without events). Trace off "
                  "kernel: the worst thread's run time in the trace against the kernel's own account of it "
                  "(schedstat at both ends), in points of the interval: a check on the trace itself (on the "
                  "development host a point or two where vCPUs run much or wake often; several points is a "
                  "misplaced switch).", "",
                  observed_by(res), ""]
        rows = []
        for (wl, n, m), a in sorted(agg.items(), key=lambda kv: (wls.index(kv[0][0]), kv[0][1], kv[0][2])):
            if a["trace_hazard"] is None:
                continue
            rows.append([wl, str(n), m, _pct(a["hazard"], 1), _pct(a["trace_hazard"], 1),
                         _num(a["truth_err_pp"], "{:.1f}"), _num(a["truth_err_max_pp"], "{:.1f}"),
                         _num(a["skew_ms"]), _num(a["trace_skew_ms"]), _pct(a["reconstructed"], 1),
                         _num(a["trace_off_pp"], "{:.1f}")])
        lines += _table(["workload", "guests", "mode", "hazard (cosched)", "hazard (trace)", "error pp",
                         "worst pp", "skew ms (cosched)", "skew ms (trace)", "reconstructed",
                         "trace off kernel pp"], rows)
        errs = [a["truth_err_pp"] for a in agg.values() if a["truth_err_pp"] is not None]
        worst = [a["truth_err_max_pp"] for a in agg.values() if a["truth_err_max_pp"] is not None]
        off = [a["trace_off_pp"] for a in agg.values() if a["trace_off_pp"] is not None]
        if errs:
            lines += ["", f"Over all {len(errs)} groups: mean error {mean(errs):.1f} points, worst single guest "
                          f"{max(worst):.1f} points. Lost trace events: "
                          f"{sum(a['overruns'] for a in agg.values())}."
                          + (f" Trace off the kernel's run time by at most {max(off):.1f} points." if off else "")]
        lines += reactions(agg, wls) + together(agg, wls, counts, modes)
    lines += spread(res) + targets(res, agg) + mixed(res) + phases(res) + steady(res)
    notes = sorted({n for a in agg.values() for n in a["notes"]})
    if notes:
        lines += ["", "Notes from the daemon:"] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


WINDOWS = (1, 2, 5, 10)     # seconds: windows for the spread within a run


def _episodes(figs: list[dict]) -> dict | None:
    """Guests' hazard episodes pooled: medians averaged over guests, the
    share boosted in time weighted by each guest's episodes due a reaction
    (none from results that did not count them: ``due`` came later)."""
    if not figs:
        return None
    out = {"p50_ms": _mean([f["p50_ms"] for f in figs]), "p90_ms": _mean([f["p90_ms"] for f in figs]),
           "long": sum(f["long"] for f in figs), "due": None, "reaction_p50_ms": None, "in_time": None}
    if all("due" in f for f in figs):
        due = sum(f["due"] for f in figs)
        out.update(due=due, reaction_p50_ms=_mean([f["reaction_p50_ms"] for f in figs]),
                   in_time=sum(f["due_in_time"] * f["due"] for f in figs if f["due"]) / due if due else None)
    return out


def reactions(agg: dict, wls: list[str]) -> list[str]:
    """How long a vCPU waits while a sibling runs, and how soon ``boost`` answers."""
    rows = []
    for (wl, n, m), a in sorted(agg.items(), key=lambda kv: (wls.index(kv[0][0]), kv[0][1], kv[0][2])):
        e = a.get("episodes")
        if e and m.split(":")[0] in ("cfs", "boost", "relaxed", "auto"):
            rows.append([wl, str(n), m, _num(e["p50_ms"]), _num(e["p90_ms"]), str(e["long"]),
                         _num(e["due"], "{}"), _pct(e["in_time"], 0), _num(e["reaction_p50_ms"]),
                         *(_num(a[f"boosts_{k}"], "{}") for k in ("made", *HELD))])
    if not rows:
        return []
    return ["", "### Hazard episodes and boost reaction (trace)", "",
            "An episode: one vCPU runnable but not running while a sibling runs, from the trace. Length at "
            "the median and p90 (mean over guests); how many lasted longer than 1 ms; the episodes due a "
            "reaction: those longer than 1 ms and those boosted within 1 ms of their start (a boost: a "
            "`sched_setattr` after which the vCPU's next switch or wake-up shows a realtime or deadline "
            "priority; a boost in time may end its episode sooner: counted by length alone, those would "
            "drop out); of these, the share boosted within 1 ms of the episode's start (over half: `boost` "
            "reacts within 1 ms at the median); the median time to that boost where there was one. From the "
            "daemon, over all repetitions: the boosts it made, and the long waits it saw and held back, "
            "each counted once under the first reason: as many vCPUs as the pool has CPUs boosted already "
            "(room), or the last boost of its vCPU, or of the runner it is queued behind, ended less than "
            "`pause-ms` before (pause), or its SCHED_FIFO boosts used their RT runtime budget (runtime; "
            "not recorded before it was counted); the boosts the kernel refused (EBUSY from deadline admission "
            "control, each attempt; not recorded before it was counted); the boosts taken back at once "
            "because they found a deadline state left from an earlier boost (stale; not recorded before it "
            "was counted); and the long waits held while the switcher checked the kernel's deadline "
            "admission total (check; not recorded before it was counted).", ""] + \
        _table(["workload", "guests", "mode", "episode p50 ms", "episode p90 ms", "episodes > 1 ms",
                "episodes due", "boosted within 1 ms", "reaction p50 ms", "boosts", *(f"held: {why}" for why in HELD)], rows)


def together(agg: dict, wls: list[str], counts: list[int], modes: list[str]) -> list[str]:
    """How much of the time a guest's vCPUs all ran at once, against the
    throughput: a spin barrier among them is crossed only then."""
    rows = []
    for wl in wls:
        alone = (agg.get((wl, 1, "alone")) or {}).get("together")
        for n in counts:
            for m in modes:
                a = agg.get((wl, n, m)) or {}
                if not alone or a.get("together") is None or not a.get("of_ideal"):
                    continue
                co, ind = n * a["together"] / alone, n * a["independent"] / alone
                rows.append([wl, str(n), m, _pct(mean(a["of_ideal"])), _pct(co), _pct(ind),
                             _num(co / ind if ind else None)])
    if not rows:
        return []
    return ["", "### All vCPUs at once (trace)", "",
            "The time each guest had all its vCPUs on CPUs at once, summed over the guests, relative to "
            "that of one guest alone (co-running of the ideal), next to the throughput of the ideal from "
            "the first table, and the co-running the same run times would give if each CPU chose what to "
            "run independently of the others (per guest, the product of its vCPUs' shares of the interval "
            "on a CPU). A spin barrier among all vCPUs is crossed only while they all run. Above 1 in the "
            "last column, a mode lines its vCPUs' runs up; below, it keeps them apart.", ""] + \
        _table(["workload", "guests", "mode", "throughput", "co-run", "if independent", "co-run / independent"],
               rows)


def observed_by(res: dict) -> str:
    """Where the daemon's hazard and skew came from in the runs: the
    in-kernel meter or /proc samples (runs before the meter: /proc)."""
    runs = [r for r in _sweep(res) if r.get("mode") not in ("batch", "alone")]
    meter = sum(1 for r in runs if (r.get("observation") or {}).get("source") == "meter")
    if meter == 0:
        return "cosched's figures: estimated from /proc samples (the sampler) in every run."
    if meter == len(runs):
        return "cosched's figures: counted by the in-kernel meter in every run."
    return (f"cosched's figures: counted by the in-kernel meter in {meter} runs, estimated from "
            f"/proc samples in {len(runs) - meter}.")


def spread(res: dict) -> list[str]:
    """How far one measurement is from the next: between repetitions of a
    cell (points of the ideal, max − min), and within a run (coefficient of
    variation of a guest's rate over consecutive windows of 1, 2, 5 and
    10 s, where the run holds at least three such windows)."""
    cells: dict[tuple, list[float]] = {}
    cvs: dict[int, list[float]] = {k: [] for k in WINDOWS}
    for r in _sweep(res):
        if not r.get("valid"):
            continue
        if r["mode"] != "alone" and r.get("ideal"):
            cells.setdefault((r["workload"], r["guests"], r["mode"]), []).append(_rate(r) / r["ideal"])
        for g in r["per_guest"].values():
            xs = g.get("rates_1s") or []
            for k in WINDOWS:
                means = [mean(xs[i:i + k]) for i in range(0, len(xs) - k + 1, k)]
                if len(means) >= 3 and mean(means) > 0:
                    cvs[k].append(pstdev(means) / mean(means))
    gaps = [100 * (max(v) - min(v)) for v in cells.values() if len(v) >= 2]
    if not gaps and not cvs[1]:
        return []
    out = ["", "## Spread", ""] + counters_against_lines(res)
    if gaps:
        out.append(f"Between repetitions of one cell ({len(gaps)} cells with two or more valid runs): "
                   f"median {median(gaps):.1f}, 90th percentile {nearest_rank(gaps, 0.9):.1f}, largest "
                   f"{max(gaps):.1f} points of the ideal.")
    if cvs[1]:
        out.append("Within a run, a guest's rate over consecutive windows varies by (median coefficient of "
                   "variation over guest-runs with three windows or more; 90th percentile; guest-runs): " +
                   "; ".join(f"{k} s: {100 * median(v):.1f}%, {100 * nearest_rank(v, 0.9):.1f}% ({len(v)})"
                             for k, v in cvs.items() if v) + ".")
    return out


def counters_against_lines(res: dict) -> list[str]:
    """How the exact rates (live counters) compare with what the result lines
    alone gave, over the guest-runs whose lines covered at least the
    validity bound: a check of both, and of how much the lines miss."""
    bound = res["config"].get("min_coverage", 0.9)
    gs = [g for r in res["runs"] for g in r["per_guest"].values() if "line_rate" in g]
    both = [abs(g["line_rate"] - g["rate"]) / g["rate"] for g in gs
            if g["line_coverage"] >= bound and g["rate"] > 0]
    short = sum(1 for g in gs if g["line_coverage"] < bound)
    if not gs:
        return []
    text = (f"Rates from live counters against rates from result lines: {len(gs)} guest-runs, "
            f"{short} whose lines spanned under {100 * bound:.0f}% of the interval (they would have been invalid)")
    if both:
        text += (f"; where the lines did span it, they differ by a median {100 * median(both):.2f}%, "
                 f"at most {100 * max(both):.2f}%")
    return [text + ".", ""]


def _rate(r: dict) -> float:
    return sum(g["rate"] for g in r["per_guest"].values())


def _repetitions(res: dict, wl: str, n: int) -> dict[int, dict[str, dict]]:
    """Repetition -> mode -> run, for one row, valid runs only."""
    by_rep: dict[int, dict[str, dict]] = {}
    for r in _sweep(res):
        if r["workload"] == wl and r["guests"] == n and r.get("valid", True):
            by_rep.setdefault(r["rep"], {})[r["mode"]] = r
    return by_rep


def _ratios(res: dict, wl: str, n: int, mode: str, against) -> list[float]:
    """Per repetition: ``mode``'s aggregate throughput over ``against(runs of that repetition)``'s,
    valid runs only, measured in the same repetition."""
    out = []
    for rep in _repetitions(res, wl, n).values():
        base = against(rep)
        if mode in rep and base:
            out.append(_rate(rep[mode]) / base)
    return out


def plans_alike(res: dict) -> bool:
    """Whether gang and partial plan alike in this run: a pool no bigger
    than one guest's vCPUs (one cell, the same turns)."""
    return res["config"].get("vcpus", 0) >= res.get("host", {}).get("cpus", float("inf"))


def plan_apart(res: dict, wl: str, n: int, static: list[str]) -> list[float]:
    """Where gang and partial plan alike: per repetition, each of their two
    runs over the best of the other static modes of that repetition (valid
    runs only; a repetition without both, or without another mode, gives
    nothing)."""
    if not plans_alike(res):
        return []
    out = []
    for rep in _repetitions(res, wl, n).values():
        if "gang" not in rep or "partial" not in rep:
            continue
        for drawn in ("gang", "partial"):
            rest = [_rate(rep[m]) for m in static if m != drawn and m in rep]
            if rest:
                out.append(_rate(rep[drawn]) / max(rest))
    return out


def targets(res: dict, agg: dict) -> list[str]:
    """The adaptive policies against their targets, repetition by repetition."""
    c = res["config"]
    modes = set(c["modes"])
    if not {"cfs", "auto"} <= modes:
        return []
    static = [m for m in ("cfs", "gang", "partial", "boost", "relaxed") if m in modes]
    lines = ["", "## Adaptive policies against their targets", "",
             "Ratios of aggregate throughput within one repetition (valid runs only); min–max over "
             "repetitions. Targets: auto ≥ 0.95× the best static mode of that repetition; boost ≥ 2× cfs "
             "on barrier and ≥ 0.95× cfs on blocking; relaxed ≥ 0.8× gang on barrier. partial / gang "
             "is the noise to read these against where the two plan alike (a pool no bigger than "
             "one guest's vCPUs, as with 2-vCPU guests on 2 CPUs: one cell, the same turns). "
             "Hindsight / best static is what auto's target asks of a chooser that knew the answer: "
             "the static mode closest to the best on average over the row's repetitions, against the "
             "best static mode of each repetition; below 0.95 no single choice met the target in "
             "every repetition. That choice is measured by its own run, which is one of those it is set "
             "against (so the best reads 1.00); where gang and partial plan alike, every repetition runs "
             "their plan twice, and the plan apart / best of four sets each of the two runs against the best "
             "of the other four static modes of its repetition: what a chooser that always picked that plan "
             "would have got, measured apart (shown where it was the hindsight choice; met: in how many of "
             "the runs).", ""]

    def best(rep):
        rates = [_rate(rep[m]) for m in static if m in rep]
        return max(rates) if rates else None

    def cell(values, target):
        if not values:
            return "-"
        ok = "met" if min(values) >= target else "not met"
        return f"{min(values):.2f}–{max(values):.2f} ({ok})"
    rows = []
    for wl in c["workloads"]:
        for n in c["guests"]:
            noise = _ratios(res, wl, n, "partial", lambda rep: rep.get("gang") and _rate(rep["gang"]))
            means = {m: _mean(_ratios(res, wl, n, m, best)) for m in static}
            means = {m: v for m, v in means.items() if v is not None}
            hindsight = max(means, key=means.get) if means else None
            apart = plan_apart(res, wl, n, static) if hindsight in ("gang", "partial") else []
            row = [wl, str(n), f"{min(noise):.2f}–{max(noise):.2f}" if noise else "-",
                   f"{hindsight} {cell(_ratios(res, wl, n, hindsight, best), 0.95)}" if hindsight else "-",
                   f"{min(apart):.2f}–{max(apart):.2f} (met {sum(a >= 0.95 for a in apart)} of {len(apart)})"
                   if apart else "-",
                   cell(_ratios(res, wl, n, "auto", best), 0.95)]
            row.append(cell(_ratios(res, wl, n, "boost", lambda rep: rep.get("cfs") and _rate(rep["cfs"])),
                            2.0 if wl == "barrier" else 0.95) if wl in ("barrier", "blocking") else "")
            row.append(cell(_ratios(res, wl, n, "relaxed", lambda rep: rep.get("gang") and _rate(rep["gang"])), 0.8)
                       if wl == "barrier" else "")
            chosen = sorted({m for r in _sweep(res) if r["workload"] == wl and r["guests"] == n and
                             r["mode"] == "auto" for m in (r.get("modes", {}).get("end") or {}).values() if m})
            row.append(", ".join(chosen) or "-")
            rows.append(row)
    return lines + _table(["workload", "guests", "partial / gang", "hindsight / best static",
                           "plan apart / best of four", "auto / best static",
                           "boost / cfs", "relaxed / gang", "auto chose"], rows)


def cpu_bound(demand: list[float], cpus: int) -> float:
    """The most that CPU time allows the sum of relative throughputs to be:
    a guest that kept ``d`` CPUs busy alone gets at most ``c / d`` of its
    throughput from ``c`` CPUs, and the host has ``cpus``; the CPUs go to the
    guests that need fewest first (each CPU then buys the most)."""
    left, total = float(cpus), 0.0
    for d in sorted(x for x in demand if x > 0):
        c = min(d, left)
        total, left = total + c / d, left - c
    return total


def layout_text(layout: dict | None, label: dict[str, str]) -> str:
    """The host's composition under ``auto`` (a run's ``layout``) in one line:
    each cell's turns in order, each with its guests (by ``label``), their
    mode (``none+slot``: hosted) and its length; then the guests left free."""
    if not layout:
        return "no layout"
    def turn(slots: list[dict]) -> str:
        mode = "none+slot" if slots[0]["hosted"] else slots[0]["mode"]
        return f"{' + '.join(label.get(s['domain'], s['domain']) for s in slots)} {mode} {slots[0]['slot_ms']} ms"
    parts = []
    for c in layout.get("cells", []):
        turns: dict[int, list[dict]] = {}
        for s in c["slots"]:
            turns.setdefault(s["turn"], []).append(s)
        parts.append(f"cell {c['cell']} ({c['kind']}, CPUs {','.join(map(str, c['cpus']))}, cycle {c['cycle_ms']} ms): "
                     + " → ".join(turn(turns[t]) for t in sorted(turns)))
    free = [label.get(n, n) for n in layout.get("free", [])]
    return "; ".join(parts + ([f"free: {', '.join(free)}"] if free else [])) or "no cell"


def mixed(res: dict) -> list[str]:
    """Mixed hosts: each guest's throughput relative to itself alone, and the sum."""
    runs = [r for r in res["runs"] if r["workload"] == "mixed"]
    if not runs:
        return []
    lines = ["", "## Mixed hosts", "",
             "Guests of different workloads together. Each guest's throughput relative to itself alone "
             "(the others paused, same repetition), median over repetitions; `sum` adds the relative "
             "figures. Targets: auto's sum at least the best single static policy's (1.10× where a guest "
             "idles or sleeps beside others), and no guest under 0.8× what its own best static policy "
             "gives it. `none+slot` in auto's modes: left to the host scheduler, hosted in the rotation (a turn of its own before commit 59d71cd, the turn the hosted guests share since).", ""]
    for unit in sorted({r["unit"] for r in runs}, key=lambda u: (len(u), u)):
        rs = [r for r in runs if r["unit"] == unit and r.get("valid", True)]
        names = list(rs[0]["guest_workloads"]) if rs else []
        modes = list(dict.fromkeys(r["mode"] for r in rs))
        rel: dict[str, dict[str, list[float]]] = {m: {g: [] for g in names} for m in modes}
        for r in rs:
            for g in names:
                if r["alone"].get(g):
                    rel[r["mode"]][g].append(r["per_guest"][g]["rate"] / r["alone"][g])
        head = ["mode"] + [f"{rs[0]['guest_workloads'][g]}" for g in names] + ["sum"]
        rows = []
        sums = {}
        for m in modes:
            per = [_median(rel[m][g]) for g in names]
            sums[m] = sum(v for v in per if v is not None)
            rows.append([m] + [_num(v) for v in per] + [_num(sums[m])])
        held = {r.get("held_out") for r in rs}
        kept = ("; held out: auto's thresholds were never tuned on it" if held == {True} else
                "; tuning set: auto's thresholds were set on it" if held == {False} else "")
        lines += [f"{unit} ({len(names)} guests{kept}):", ""] + _table(head, rows) + [""]
        demand = {g: [r["alone_cpus"][g] for r in rs if (r.get("alone_cpus") or {}).get(g)] for g in names}
        if all(demand.values()):
            need = {g: _mean(v) for g, v in demand.items()}
            cpus = rs[0].get("cpus", 2)
            lines += ["Alone, each guest kept busy " + ", ".join(
                f"{rs[0]['guest_workloads'][g]} {need[g]:.2f}" for g in names) + f" CPUs (mean over repetitions); "
                f"with {cpus} CPUs, CPU time allows a sum of at most {cpu_bound(list(need.values()), cpus):.2f} "
                "(each guest's throughput in proportion to its CPU time, the CPUs to the guests needing fewest "
                "first; synchronisation costs nothing in this bound).", ""]
        static = [m for m in modes if not m.startswith("auto")]
        for a in (m for m in modes if m.startswith("auto")):
            laid = [r for r in rs if r["mode"] == a and "layout" in r]
            seen = Counter(layout_text(r["layout"], rs[0]["guest_workloads"]) for r in laid)
            slots = [f"Slots {a} laid out, at the end of each repetition:", ""] + [
                f"- {text} (in {n} of {len(laid)})" for text, n in seen.most_common()] + [""] if laid else []
            if not static:
                lines += slots
                continue
            top = max(static, key=lambda m: sums[m])
            best = {g: max(static, key=lambda m: _median(rel[m][g]) or 0) for g in names
                    if any(_median(rel[m][g]) for m in static)}
            floor = {g: (_median(rel[a][g]) or 0) / _median(rel[best[g]][g]) for g in best}
            worst = min(floor, key=floor.get)
            chose = "; ".join(f"{rs[0]['guest_workloads'][g]} " + ", ".join(sorted(
                {r["modes"]["end"][g] for r in rs if r["mode"] == a and r["modes"]["end"].get(g)})) for g in names)
            lines += [f"{a}'s sum is {sums[a] / sums[top]:.2f}× that of the best static policy ({top}); "
                      f"the guest {a} serves worst ({rs[0]['guest_workloads'][worst]}) gets {floor[worst]:.2f}× "
                      f"its own best static policy ({best[worst]}). Modes {a} chose: {chose}.", ""] + slots
    return lines


def phases(res: dict) -> list[str]:
    """Guests changing phase: throughput per phase kind, and how long auto took to follow."""
    runs = [r for r in res["runs"] if r["workload"] == "phases"]
    if not runs:
        return []
    lines = ["", "## Phase changes", "",
             f"Two guests alternating barrier and blocking phases of {runs[0]['phase_ms'] / 1000:g} s (guest time), "
             "each mode for the same span. Mean throughput per complete phase (both guests). For auto, "
             "the time from the first result line of a phase to the status showing the mode it then kept "
             "(0: no change needed; the status is polled every 0.25 s). Coverage: the least share of a phase "
             "its result lines spanned, over both guests (its rate is measured over that span; "
             "lines come every 0.1 s).", ""]
    rows = []
    follow = []
    for r in runs:
        ps = [p for g in r["per_guest"].values() for p in g["phases"]]
        row = [r["mode"]]
        for kind in ("barrier", "blocking"):
            rates = [p["rate"] for p in ps if p["kind"] == kind]
            row.append(_num(_mean(rates), "{:.0f}") + f" ({len(rates)})")
        covered = [p["coverage"] for p in ps if "coverage" in p]     # older runs do not record it
        row.append(_pct(min(covered)) if covered and len(covered) == len(ps) else "-")
        rows.append(row)
        if r["mode"] == "auto":
            follow = [(name, [(p["kind"], p["mode_before"], p["mode_settled"], p["follow_s"]) for p in g["phases"]])
                      for name, g in r["per_guest"].items()]
    lines += _table(["mode", "barrier phases, iterations/s (phases)", "blocking phases, iterations/s (phases)",
                     "coverage"], rows)
    if follow:
        lines += ["", "auto, per guest and phase: " + "; ".join(f"{name}: " + ", ".join(
            f"{k} {a}→{b} in {_num(t, '{:.1f}')} s" if a != b else f"{k} kept {b}" for k, a, b, t in ps)
            for name, ps in follow) + "."]
    return lines


def _steady_row(r: dict) -> list[str]:
    held: dict[str, float] = {}
    for p in r["per_guest"].values():
        for m, v in p["held_s"].items():
            held[m] = held.get(m, 0.0) + v
    total = sum(held.values()) or 1.0
    most = max(len(p["changes"]) for p in r["per_guest"].values())
    per_min = most * 60.0 / r["seconds"]
    return [r["steady_workload"], str(r["guests"]),
            ", ".join(f"{m} {_pct(v / total)}" for m, v in sorted(held.items(), key=lambda kv: -kv[1])),
            str(most), f"{per_min:.1f}",
            "invalid" if not r.get("valid", True) else "met" if per_min <= 1.0 else "not met"]


def steady(res: dict) -> list[str]:
    """Guests of one workload under auto: how often it changed their mode."""
    runs = [r for r in res["runs"] if r["workload"] == "steady"]
    return ["", "## Steady guests under auto", "",
            f"The guests of each workload, after its repetitions, under auto for {runs[0]['seconds']:g} s, once "
            "it had had as long to choose as before any auto run; the status polled every 0.25 s (a run is "
            f"valid when no read was more than {runs[0]['gap_s']:g} s from the next, each showing every guest's "
            "mode). The modes shown (share of the time, over the guests) and the changes of mode of the guest "
            "that changed most. Target: at most one change a minute.", "",
            *_table(["workload", "guests", "modes", "changes", "per minute", "target"],
                    [_steady_row(r) for r in runs])] if runs else []


def plots(res: dict, out: Path, agg: dict | None = None) -> list[Path]:
    """Draw the PNGs into ``out``; return their paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agg = agg or aggregate(res)
    c = res["config"]
    modes, counts, wls = c["modes"], c["guests"], c["workloads"]
    if not wls:                      # mixed hosts or phases only: their tables say it all
        return []
    top = max(counts)
    xs = [1, *counts]
    written = []

    def save(fig, name):
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)

    def grid(n):
        cols = min(n, 4)
        rows = (n + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.9 * rows), squeeze=False)
        for ax in axes.flat[n:]:
            ax.set_visible(False)
        return fig, list(axes.flat)

    fig, axes = grid(len(wls))
    for ax, wl in zip(axes, wls):
        for m in modes:
            ys = [1.0] + [mean(agg[(wl, n, m)]["of_ideal"]) if (wl, n, m) in agg else float("nan") for n in counts]
            lo = [0.0] + [ys[i + 1] - min(agg[(wl, n, m)]["of_ideal"]) if (wl, n, m) in agg else 0 for i, n in enumerate(counts)]
            hi = [0.0] + [max(agg[(wl, n, m)]["of_ideal"]) - ys[i + 1] if (wl, n, m) in agg else 0 for i, n in enumerate(counts)]
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=2, label=m)
        ax.set_title(wl)
        ax.set_xlabel("guests")
        ax.set_ylabel("throughput / ideal")
        ax.set_xticks(xs)
        ax.set_ylim(bottom=0)
    axes[0].legend(fontsize="small")
    save(fig, "throughput.png")

    if "deadline" in wls:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        alone = (agg.get(("deadline", 1, "alone")) or {}).get("missed_pct")
        for m in modes:
            ys = [alone] + [(agg.get(("deadline", n, m)) or {}).get("missed_pct") for n in counts]
            ax.plot(xs, [float("nan") if y is None else y for y in ys], marker="o", label=m)
        ax.set_xlabel("guests")
        ax.set_ylabel("missed deadlines (%)")
        ax.set_xticks(xs)
        ax.set_ylim(0, 100)
        ax.legend(fontsize="small")
        save(fig, "missed_deadlines.png")

    fig, axes = grid(len(wls))
    for ax, wl in zip(axes, wls):
        for m in ["alone", *modes]:
            a = agg.get((wl, 1 if m == "alone" else top, m))
            if a and a["hist"]:
                pts = hist_cdf(a["hist"])
                ax.step([x for x, _ in pts], [f for _, f in pts], where="post", label=m,
                        linestyle="--" if m == "alone" else "-")
        ax.set_xscale("log")
        ax.set_title(f"{wl}, {top} guests")
        ax.set_xlabel("iteration time (s)")
        ax.set_ylabel("CDF")
    axes[0].legend(fontsize="small")
    save(fig, "iteration_cdf.png")

    for name, key, label in (("fairness.png", "jain", "Jain's index"),
                             ("hazard.png", "hazard", "concurrency hazard fraction")):
        fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(wls)), 3.5))
        width = 0.8 / len(modes)
        for i, m in enumerate(modes):
            ys = [(agg.get((wl, top, m)) or {}).get(key) for wl in wls]
            ax.bar([j + i * width for j in range(len(wls))], [0 if y is None else y for y in ys], width, label=m)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(wls))], wls)
        ax.set_ylabel(label)
        ax.set_title(f"{top} guests")
        ax.set_ylim(0, 1.05)
        ax.legend(fontsize="small")
        save(fig, name)

    fig, ax = plt.subplots(figsize=(5, 3.5))
    cpu = [_mean([a["cpu_pct"] for (wl, n, mm), a in agg.items() if mm == m]) or 0 for m in modes]
    ax.bar(modes, cpu)
    ax.set_ylabel("daemon + switcher CPU (% of one CPU)")
    save(fig, "overhead.png")

    if c.get("truth"):
        fig, ax = plt.subplots(figsize=(4.5, 4.5))
        for m in modes:
            pts = [(g["trace"]["hazard"], g["hazard"]) for r in res["runs"] if r["mode"] == m
                   for g in r["per_guest"].values() if g.get("trace") and g.get("hazard") is not None]
            if pts:
                ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=12, label=m)
        d = TRUTH_TARGET_PP / 100
        ax.plot([0, 1], [0, 1], color="black", linewidth=0.8)
        ax.fill_between([0, 1], [-d, 1 - d], [d, 1 + d], color="grey", alpha=0.2, label=f"±{TRUTH_TARGET_PP:g} points")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("hazard fraction, kernel trace (exact)")
        ax.set_ylabel("hazard fraction, cosched")
        ax.legend(fontsize="small")
        save(fig, "truth.png")
    return written


def write(res: dict, out: Path) -> str:
    """Write ``summary.md`` and the plots into ``out``; return the summary."""
    agg = aggregate(res)
    text = summary(res, agg)
    (out / "summary.md").write_text(text)
    plots(res, out, agg)
    return text


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    print(write(json.loads((folder / "results.json").read_text()), folder))
