"""Benchmark statistics and the exact, trace-based hazard."""
import argparse

import pytest

from benchmarks.suite import quantile
from benchmarks.stats import (FROZEN, RUNNABLE, RUNNING, SLEEPING, Event, cdf, episode_figures, hazard_episodes, hist_add,
                              hist_bounds, hist_cdf, hist_delta, hist_quantile, jain, of_ideal, timelines, trace_figures,
                              window_skews)
from cosched.sampler.estimate import estimate


def test_jain():
    assert jain([5, 5, 5]) == pytest.approx(1.0)
    assert jain([9, 0, 0]) == pytest.approx(1 / 3)
    assert jain([0, 0]) == 0.0


def test_cdf_and_ideal():
    assert cdf([3, 1, 2, 2]) == [(1, 0.25), (2, 0.75), (3, 1.0)]
    assert of_ideal(45, 50) == 0.9 and of_ideal(1, 0) == 0.0


def test_histogram_quantile_interpolates_like_prometheus():
    after = [(0.001, 50.0), (0.002, 100.0), (float("inf"), 100.0)]
    assert quantile(0.5, [], after) == pytest.approx(0.001)
    assert quantile(0.75, [], after) == pytest.approx(0.0015)
    before = [(0.001, 50.0), (0.002, 50.0), (float("inf"), 50.0)]
    assert quantile(0.5, before, after) == pytest.approx(0.0015)   # only the increase counts


def synthetic():
    # two vCPUs over 10 ms: vcpu 1 runs 0-6, vcpu 2 waits 0-4, runs 4-10; vcpu 1 sleeps 6-10
    events = [Event(4e-3, 2, "in"), Event(6e-3, 1, "out-sleep")]
    return timelines(events, {1: RUNNING, 2: RUNNABLE}, 0.0, 10e-3)


def test_timelines_cover_the_window():
    lines = synthetic()
    assert lines[1] == [(0.0, 6e-3, RUNNING), (6e-3, 10e-3, SLEEPING)]
    assert lines[2] == [(0.0, 4e-3, RUNNABLE), (4e-3, 10e-3, RUNNING)]


def test_exact_hazard_and_partial_from_trace():
    f = trace_figures(synthetic())
    assert f["hazard"] == pytest.approx(4e-3)       # 0-4: one runs, one waits
    assert f["partial"] == pytest.approx(0.0)
    assert f["together"] == pytest.approx(2e-3)     # 4-6: both run
    assert f["run"] == {1: pytest.approx(6e-3), 2: pytest.approx(6e-3)}
    assert f["wait"] == {1: 0.0, 2: pytest.approx(4e-3)}


def test_hazard_episodes_and_the_boosts_that_answered_them():
    ms = 1e-3
    # vcpu 2 waits 0-4 while vcpu 1 runs (one episode, boosted at 0.6 ms); vcpu 1 sleeps 6-10;
    # vcpu 2 then waits 7-9 while vcpu 3 runs 7.5-8 and 8.5-9: two episodes, neither boosted
    lines = {1: [(0.0, 6 * ms, RUNNING), (6 * ms, 10 * ms, SLEEPING)],
             2: [(0.0, 4 * ms, RUNNABLE), (4 * ms, 7 * ms, RUNNING), (7 * ms, 9 * ms, RUNNABLE),
                 (9 * ms, 10 * ms, RUNNING)],
             3: [(0.0, 7.5 * ms, SLEEPING), (7.5 * ms, 8 * ms, RUNNING), (8 * ms, 8.5 * ms, SLEEPING),
                 (8.5 * ms, 9 * ms, RUNNING), (9 * ms, 10 * ms, SLEEPING)]}
    # boosts of 2 at 0.6 ms and 5 ms, one refused at 0.5 ms, one of 3 at 1 ms; a return reaching 2 at 7.5 ms
    calls = [(0.6 * ms, 2, True, True), (0.5 * ms, 2, False, False), (5 * ms, 2, True, True), (1 * ms, 3, True, True),
             (7.5 * ms, 2, True, False)]
    eps = sorted(hazard_episodes(lines, calls))
    assert [d for d, _ in eps] == [pytest.approx(0.5 * ms)] * 2 + [pytest.approx(4 * ms)]
    assert eps[-1][1] == pytest.approx(0.6 * ms) and eps[0][1] is None and eps[1][1] is None
    f = episode_figures(eps)
    assert f["n"] == 3 and f["long"] == 1 and f["due"] == 1 and f["due_in_time"] == 1.0
    assert f["reaction_p50_ms"] == pytest.approx(0.6) and f["p50_ms"] == pytest.approx(0.5)
    assert episode_figures([])["due_in_time"] is None
    assert hazard_episodes({1: [(0.0, 1.0, RUNNABLE)]}, []) == []       # waiting alone is no hazard


def test_an_episode_a_boost_ended_in_time_is_still_due_a_reaction():
    ms = 1e-3
    # over 1 ms and boosted late; cut short by a boost at 0.3 ms; over 1 ms, never boosted;
    # short and never boosted (over on its own: due nothing); boosted, but after it ended
    eps = [(4 * ms, 1.5 * ms), (0.4 * ms, 0.3 * ms), (2 * ms, None), (0.5 * ms, None), (0.5 * ms, None)]
    f = episode_figures(eps)
    assert f["long"] == 2 and f["due"] == 3
    assert f["due_in_time"] == pytest.approx(1 / 3)
    assert f["reaction_p50_ms"] == pytest.approx(1.5)       # of 0.3 and 1.5 ms: the sample at rank n / 2


def test_partial_contention_when_nobody_runs():
    lines = timelines([Event(5e-3, 1, "in")], {1: RUNNABLE, 2: SLEEPING}, 0.0, 10e-3)
    f = trace_figures(lines)
    assert f["partial"] == pytest.approx(5e-3) and f["hazard"] == 0.0


def test_wakeup_of_running_thread_is_ignored():
    lines = timelines([Event(1e-3, 1, "wakeup")], {1: RUNNING}, 0.0, 2e-3)
    assert lines[1] == [(0.0, 2e-3, RUNNING)]


def test_the_estimate_from_trace_totals_meets_the_exact_value_where_it_must():
    # one vCPU runs the whole window while its sibling waits: estimate and trace both 10 ms
    f = trace_figures(timelines([], {1: RUNNING, 2: RUNNABLE}, 0.0, 10e-3))
    placed = [(f["run"][1], f["wait"][1]), (f["run"][2], f["wait"][2])]
    assert f["hazard"] == pytest.approx(10e-3) and estimate(10e-3, placed).hazard == pytest.approx(10e-3)
    # siblings alternating on one CPU: the trace says 10 ms; grouped by CPU the estimate agrees,
    # taken as independent it says 5 ms (the error that grouping by CPU removes)
    f = trace_figures(timelines([Event(5e-3, 1, "out-runnable"), Event(5e-3, 2, "in")],
                                {1: RUNNING, 2: RUNNABLE}, 0.0, 10e-3))
    placed = [(f["run"][1], f["wait"][1]), (f["run"][2], f["wait"][2])]
    assert placed == [(pytest.approx(5e-3), pytest.approx(5e-3))] * 2
    assert f["hazard"] == pytest.approx(10e-3)
    assert estimate(10e-3, placed, cpus=[0, 0]).hazard == pytest.approx(10e-3)
    assert estimate(10e-3, placed).hazard == pytest.approx(5e-3)


def test_histogram_buckets_match_the_guest_program():
    # four buckets per power of two, as guest-init.c's hist_bucket()
    assert hist_bounds(3) == pytest.approx((3e-6, 4e-6))
    assert hist_bounds(4) == pytest.approx((4e-6, 5e-6))
    assert hist_bounds(13) == pytest.approx((20e-6, 24e-6))
    assert hist_bounds(60)[1] / hist_bounds(60)[0] == pytest.approx(5 / 4)   # 4 sub-buckets: 4/4 .. 7/4
    assert hist_bounds(63)[1] / hist_bounds(63)[0] == pytest.approx(8 / 7)


def test_histogram_delta_cdf_and_quantile():
    before, after = {13: 10}, {13: 40, 20: 10}
    d = hist_delta(before, after)
    assert d == {13: 30, 20: 10}
    assert hist_cdf(d) == [(pytest.approx(24e-6), 0.75), (hist_bounds(20)[1], 1.0)]
    assert hist_quantile(d, 0.5) == pytest.approx(24e-6)
    assert hist_quantile({}, 0.5) is None
    assert hist_add({"13": 1}, {13: 2}) == {13: 3}        # keys from JSON are strings


def test_window_skews_from_timelines():
    # 30 ms, three 10 ms windows: in the first vCPU 2 waits 4 ms, in the second vCPU 1 is frozen
    # 6 ms, in the third vCPU 1 sleeps 6 ms (an idle vCPU does not lag)
    lines = {1: [(0, 0.014, RUNNING), (0.014, 0.020, FROZEN), (0.020, 0.024, RUNNING), (0.024, 0.030, SLEEPING)],
             2: [(0, 0.004, RUNNABLE), (0.004, 0.030, RUNNING)]}
    assert window_skews(lines, 0.0, 0.030, 0.010) == [pytest.approx(0.004), pytest.approx(0.006), 0.0]


def lines(*points):
    return [{"t_ms": t, "iters": i} for t, i in points]


def test_a_rate_comes_only_from_lines_inside_the_interval_and_must_cover_it():
    from benchmarks.suite import guest_window
    rs = lines((0, 0), (1000, 100), (1100, 110), (6000, 600), (6100, 99999))
    # lines 1..3 were printed inside a 5 s interval: 5 s of guest time, 100 iterations/s
    w = guest_window(rs, 1, 4, 5.0)
    assert w["rate"] == pytest.approx(100.0) and w["coverage"] == pytest.approx(1.0) and w["valid"]
    # two lines 100 ms apart: a rate, but of 2% of the interval: invalid
    w = guest_window(rs, 1, 3, 5.0)
    assert w["coverage"] == pytest.approx(0.02) and not w["valid"]
    # nothing printed inside (a starved guest): invalid, not a rate of 0 averaged in
    assert not guest_window(rs, 4, 4, 5.0)["valid"]


def test_live_counters_give_the_rate_over_exactly_the_interval():
    from benchmarks.suite import counted, guest_window
    c = lambda i, m=0: {"iters": i, "missed": m, "errors": 0}
    # a guest the host starved: two lines close together, but its counters read 4.9 s apart
    lines_said = guest_window(lines((0, 0), (1000, 100), (1100, 110)), 1, 3, 5.0)
    w = counted((10.05, c(100, 1)), (14.95, c(590, 3)), 5.0, lines_said)
    assert w["rate"] == pytest.approx(100.0) and w["iters"] == 490 and w["missed"] == 2
    assert w["coverage"] == pytest.approx(0.98) and w["valid"]
    assert w["line_coverage"] == pytest.approx(0.02) and w["line_rate"] == pytest.approx(100.0)
    # no progress at all is a measured 0, not an invalid run
    assert counted((0.0, c(7)), (5.0, c(7)), 5.0, lines_said)["rate"] == 0.0
    # reads that do not span the interval (the harness held up) are invalid
    assert not counted((0.0, c(0)), (4.0, c(400)), 5.0, lines_said)["valid"]


def test_invalid_runs_are_counted_never_averaged():
    from benchmarks.report import aggregate, invalid_runs
    g = lambda rate: {"rate": rate, "iters": 10, "missed": 0, "hist": {}, "hazard": None, "skew_mean_ms": None}
    run = lambda mode, rate, valid, ideal=100.0: {
        "workload": "barrier", "guests": 2, "mode": mode, "valid": valid, "ideal": ideal,
        "per_guest": {"a": g(rate / 2), "b": g(rate / 2)}, "daemon_cpu_pct": 1.0}
    res = {"runs": [run("cfs", 50.0, True), run("cfs", 17932.0, False), run("gang", 90.0, True, ideal=None)]}
    agg = aggregate(res)
    assert agg[("barrier", 2, "cfs")]["of_ideal"] == [0.5]
    assert ("barrier", 2, "gang") not in agg
    assert invalid_runs(res) == {("barrier", 2, "cfs"): 1, ("barrier", 2, "gang"): 1}


def test_the_truth_table_checks_the_trace_against_the_kernels_own_run_time():
    from benchmarks.report import aggregate
    g = lambda run, kernel: {"rate": 1.0, "iters": 10, "missed": 0, "hist": {}, "hazard": 0.5, "skew_mean_ms": None,
                             "trace": {"hazard": 0.5, "skew_mean_ms": None, "run": run, "run_kernel": kernel,
                                       "episodes": None}}
    run = {"workload": "spinlock", "guests": 2, "mode": "cfs", "valid": True, "ideal": 1.0, "daemon_cpu_pct": 1.0,
           "per_guest": {"a": g({"1": 0.34, "2": 0.2}, {"1": 0.30, "2": 0.2}), "b": g({"3": 0.5}, {"3": 0.51})}}
    old = {**run, "per_guest": {"a": g({"1": 0.34}, {})}}          # a run recorded before the kernel's was kept
    assert aggregate({"runs": [run]})[("spinlock", 2, "cfs")]["trace_off_pp"] == pytest.approx(4.0)
    assert aggregate({"runs": [old]})[("spinlock", 2, "cfs")]["trace_off_pp"] is None


def test_the_target_table_says_what_a_chooser_knowing_the_answer_would_get():
    """auto's target (0.95x the best static mode of each repetition) against
    the static mode closest to the best on average: where the best changes
    from one repetition to the next, no single choice meets it."""
    from benchmarks.report import targets
    g = lambda rate: {"rate": rate}
    run = lambda rep, mode, rate: {"workload": "barrier", "guests": 2, "rep": rep, "mode": mode, "valid": True,
                                   "per_guest": {"a": g(rate)}}
    rates = {1: {"cfs": 10, "gang": 100, "partial": 90, "auto": 96}, 2: {"cfs": 10, "gang": 80, "partial": 100, "auto": 97}}
    res = {"config": {"modes": ["cfs", "gang", "partial", "auto"], "workloads": ["barrier"], "guests": [2]},
           "runs": [run(rep, m, r) for rep, modes in rates.items() for m, r in modes.items()]}
    row = [line for line in targets(res, {}) if line.startswith("| barrier")][0].split(" | ")
    assert row[3] == "partial 0.90–1.00 (not met)"          # gang: mean 0.90, partial: 0.95
    assert row[4] == "-"                                     # no host: whether the two plan alike is unknown
    assert row[5] == "0.96–0.97 (met)"


def test_the_plan_measured_apart_is_each_of_its_two_runs_against_the_other_modes():
    """Where gang and partial plan alike (2-vCPU guests on 2 CPUs), each of
    their runs against the best of the other static modes of its repetition:
    a chooser that always picked that plan, measured apart from it."""
    from benchmarks.report import plan_apart, targets
    run = lambda rep, mode, rate: {"workload": "barrier", "guests": 2, "rep": rep, "mode": mode, "valid": True,
                                   "per_guest": {"a": {"rate": rate}}}
    rates = {1: {"cfs": 10, "gang": 100, "partial": 90, "auto": 96}, 2: {"cfs": 10, "gang": 100, "partial": 96, "auto": 97}}
    res = {"config": {"modes": ["cfs", "gang", "partial", "auto"], "workloads": ["barrier"], "guests": [2], "vcpus": 2},
           "host": {"cpus": 2}, "runs": [run(rep, m, r) for rep, modes in rates.items() for m, r in modes.items()]}
    assert [round(x, 3) for x in plan_apart(res, "barrier", 2, ["cfs", "gang", "partial"])] == [1.111, 0.9, 1.042, 0.96]
    row = [line for line in targets(res, {}) if line.startswith("| barrier")][0].split(" | ")
    assert row[3] == "gang 1.00–1.00 (met)" and row[4] == "0.90–1.11 (met 3 of 4)"
    res["host"]["cpus"] = 4                                  # a pool of 4 CPUs: partial packs two guests at once
    assert plan_apart(res, "barrier", 2, ["cfs", "gang", "partial"]) == []


def test_co_running_is_summed_over_guests_against_one_guest_alone():
    from benchmarks.report import aggregate, together
    g = lambda rate, co, runs: {"rate": rate, "iters": 10, "missed": 0, "hist": {}, "hazard": None,
                                "skew_mean_ms": None, "trace": {"hazard": 0.0, "skew_mean_ms": None, "together": co,
                                                                "run": dict(enumerate(runs))}}
    run = lambda n, mode, rate, co, runs: {"workload": "barrier", "guests": n, "mode": mode, "valid": True,
                                           "ideal": 100.0, "per_guest": {k: g(rate / n, co, runs) for k in "ab"[:n]},
                                           "daemon_cpu_pct": 1.0}
    res = {"runs": [run(1, "alone", 100.0, 0.8, [0.9, 0.9]), run(2, "gang", 90.0, 0.4, [0.5, 0.4]),
                    run(2, "relaxed", 10.0, 0.05, [0.5, 0.2])]}
    rows = [r for r in together(aggregate(res), ["barrier"], [2], ["gang", "relaxed", "cfs"]) if r.startswith("| barrier")]
    # 2 x 0.4 / 0.8 co-run against 2 x 0.5 x 0.4 / 0.8 if independent; 2 x 0.05 / 0.8 against 2 x 0.1 / 0.8
    assert rows == ["| barrier | 2 | gang | 90% | 100% | 50% | 2.00 |",
                    "| barrier | 2 | relaxed | 10% | 12% | 25% | 0.50 |"]
    assert together(aggregate({"runs": [run(2, "gang", 90.0, 0.4, [0.5, 0.4])]}), ["barrier"], [2], ["gang"]) == []


def test_rates_per_second_and_the_spread_they_report():
    from benchmarks.report import spread
    from benchmarks.suite import second_rates
    # 100 ms lines: 100/s for two seconds, then 300/s for one; the last half second is no whole second
    rs = lines(*[(t, t // 10) for t in range(0, 2001, 100)], *[(2000 + t, 200 + 3 * t // 10) for t in range(100, 1501, 100)])
    assert second_rates(rs) == [pytest.approx(100.0), pytest.approx(100.0), pytest.approx(300.0)]
    assert second_rates(rs[:5]) == []
    g = lambda xs: {"rate": 1.0, "rates_1s": xs}
    run = lambda rep, total, xs: {"workload": "barrier", "guests": 2, "mode": "gang", "rep": rep, "valid": True,
                                  "ideal": 100.0, "per_guest": {"a": {**g(xs), "rate": total}}}
    res = {"config": {"seconds": 6.0},
           "runs": [run(0, 80.0, [90.0, 110.0] * 3), run(1, 95.0, [90.0, 90.0, 110.0, 110.0, 100.0, 100.0])]}
    text = "\n".join(spread(res))
    assert "median 15.0, 90th percentile 15.0, largest 15.0 points" in text       # 80% and 95% of the ideal
    # one-second CVs 10% and 8.2%; over 2 s the first is steady (0%), the second varies by 8.2%
    assert "1 s: 9.1%, 10.0% (2); 2 s: 4.1%, 8.2% (2)." in text
    assert spread({"config": {"seconds": 6.0}, "runs": []}) == []


def test_the_results_file_holds_every_finished_run_of_an_interrupted_suite(tmp_path):
    import json
    from benchmarks.report import summary
    from benchmarks.suite import Record
    path = tmp_path / "results.json"
    head = {"host": {"cpus": 2, "kernel": "k", "domain_type": "qemu"}, "command": "python -m benchmarks.suite",
            "config": {"guests": [2], "vcpus": 2, "workloads": ["barrier"], "modes": ["cfs"], "seconds": 5.0,
                       "reps": 2, "mixed": [], "phases_seconds": 0}, "planned": 4}
    g = lambda rate: {"rate": rate, "iters": 10, "missed": 0, "hist": {}, "hazard": None, "skew_mean_ms": None}
    rec = Record(path, head)
    rec.append({"workload": "barrier", "guests": 1, "mode": "alone", "rep": 0, "valid": True, "ideal": 100.0,
                "per_guest": {"a": g(100.0)}, "daemon_cpu_pct": 1.0})
    rec.append({"workload": "barrier", "guests": 2, "mode": "cfs", "rep": 0, "valid": True, "ideal": 100.0,
                "per_guest": {"a": g(3.0), "b": g(2.0)}, "daemon_cpu_pct": 1.0})
    res = json.loads(path.read_text())           # as a stopped suite leaves it
    assert res["complete"] is False and [r["mode"] for r in res["runs"]] == ["alone", "cfs"]
    assert res["ideal"] == {"barrier": 100.0}
    text = summary(res)
    assert "stopped after 2 of 4 runs" in text and "| barrier | 2 | 5% (5%–5%) |" in text
    done = rec.write(complete=True)
    assert done == json.loads(path.read_text()) and done["complete"] is True
    assert "stopped after" not in summary(done)


def test_a_resumed_suite_keeps_finished_units_and_measures_a_half_done_one_again(tmp_path, capsys):
    from benchmarks.report import summary
    from benchmarks import commit
    from benchmarks.suite import Record, main, units
    from types import SimpleNamespace
    args = SimpleNamespace(workloads=["barrier", "lu"], guests=[2], modes=["cfs"], reps=1, mixed=[], phases=0,
                           steady=0)
    sizes = units(args)
    assert sizes == {"barrier x2": 2, "lu x2": 2}
    assert units(SimpleNamespace(**{**vars(args), "steady": 60})) == {**sizes, "steady barrier x2": 1,
                                                                      "steady lu x2": 1}
    path = tmp_path / "results.json"
    head = {"host": {"cpus": 2, "kernel": "k", "domain_type": "qemu"}, "started": "day 1", "commit": commit(),
            "command": "python -m benchmarks.suite --guests 2 --workloads barrier,lu --modes cfs --reps 1",
            "config": {"guests": [2], "vcpus": 2, "workloads": ["barrier", "lu"], "modes": ["cfs"], "seconds": 5.0,
                       "reps": 1, "mixed": [], "phases_seconds": 0}, "planned": 4}
    g = lambda rate: {"rate": rate, "iters": 10, "missed": 0, "hist": {}, "hazard": None, "skew_mean_ms": None}
    run = lambda wl, mode, rate, ideal=100.0: {"workload": wl, "unit": f"{wl} x2", "guests": 2, "mode": mode,
                                               "rep": 0, "valid": True, "ideal": ideal, "per_guest": {"a": g(rate)},
                                               "daemon_cpu_pct": 1.0}
    first = Record(path, head)
    for r in (run("barrier", "alone", 100.0), run("barrier", "cfs", 5.0), run("lu", "alone", 100.0)):
        first.append(r)                          # stopped during lu
    rec = Record.resume(path, sizes)
    assert rec.units() == {"barrier x2"} and rec.sitting == 1 and rec.head["sittings"][0] == "day 1"
    assert [r["workload"] for r in rec.head["superseded"]] == ["lu"]
    rec.append(run("lu", "alone", 90.0, 90.0))
    rec.append(run("lu", "cfs", 9.0, 90.0))
    done = rec.write(complete=True)
    assert [(r["unit"], r["sitting"]) for r in done["runs"]] == [("barrier x2", 0)] * 2 + [("lu x2", 1)] * 2
    assert len(done["superseded"]) == 1 and done["command"] == head["command"]
    assert "Measured in 2 sittings" in summary(done) and "| lu | 2 | 10% (10%–10%) |" in summary(done)
    with pytest.raises(SystemExit):                # nothing to resume in a finished suite
        main(["--resume", str(tmp_path)])
    assert "holds a finished suite" in capsys.readouterr().err
    Record(path, {**head, "commit": "0000000"}).append(run("barrier", "alone", 100.0))
    with pytest.raises(SystemExit, match="began at commit 0000000"):   # another commit's suite
        Record.resume(path, sizes)


def test_no_mode_is_always_measured_last():
    from benchmarks.suite import MODES, in_turn
    modes = list(MODES)
    assert len(modes) >= 3
    orders = [in_turn(modes, rep) for rep in range(4)]
    assert all(sorted(o) == sorted(modes) for o in orders)
    assert {o[-1] for o in orders} == {modes[0], modes[-1]}
    mean_place = {m: sum(o.index(m) for o in orders) / len(orders) for m in modes}
    assert set(mean_place.values()) == {(len(modes) - 1) / 2}


def test_a_mode_names_a_preset_and_may_set_its_parameters():
    from benchmarks.suite import _modes, mode_policy
    assert mode_policy("cfs") == mode_policy("batch") == ("none", {})
    assert mode_policy("boost:pause-ms=0:boost-ms=1") == ("boost", {"pause-ms": "0", "boost-ms": "1"})
    assert _modes("gang,boost:pause-ms=0") == ["gang", "boost:pause-ms=0"]
    assert mode_policy("auto:allow=none+gang") == ("auto", {"allow": "none,gang"})
    with pytest.raises(argparse.ArgumentTypeError, match="boost:pause-ms"):
        _modes("boost:pause-ms")


def test_a_mode_is_taken_up_when_status_shows_its_parameters_as_written():
    from benchmarks.suite import _param_text
    assert _param_text(False) == "false" and _param_text(True) == "true"      # relaxed:boost=false
    assert _param_text(["none", "gang"]) == "none,gang" and _param_text(2.5) == "2.5"


def test_a_steady_run_counts_each_change_of_mode_and_is_valid_only_where_status_covered_it():
    from benchmarks.report import steady
    from benchmarks.suite import steady_figures
    tl = [(0.1 + 0.25 * i, {}, {"a": "gang" if i < 100 else "none", "b": "gang"}) for i in range(240)]
    a, b = steady_figures(tl, "a", 60.0), steady_figures(tl, "b", 60.0)
    assert a["changes"] == [{"t": tl[100][0], "old": "gang", "new": "none"}] and b["changes"] == []
    assert a["held_s"] == pytest.approx({"gang": 25.1, "none": 34.9}) and b["held_s"] == pytest.approx({"gang": 60.0})
    assert a["covered"] and b["covered"]
    gap = tl[:50] + tl[56:]                                  # 1.5 s without a read
    assert not steady_figures(gap, "b", 60.0)["covered"]
    assert not steady_figures(tl[:-8], "b", 60.0)["covered"]      # the reads stopped 2 s before the end
    unknown = tl[:10] + [(tl[10][0], {}, {"a": None, "b": "gang"})] + tl[11:]
    assert not steady_figures(unknown, "a", 60.0)["covered"] and steady_figures(unknown, "b", 60.0)["covered"]
    assert not steady_figures([], "a", 60.0)["covered"]
    flap = [(0.1 + 0.25 * i, {}, {"a": ("gang", "none")[(i // 40) % 2]}) for i in range(240)]
    run = lambda wl, figs, valid=True: {"workload": "steady", "steady_workload": wl, "guests": 2, "mode": "auto",
                                        "seconds": 60.0, "gap_s": 1.0, "valid": valid, "per_guest": figs}
    text = "\n".join(steady({"runs": [run("barrier", {"a": a, "b": b}),
                                     run("blocking", {"a": steady_figures(flap, "a", 60.0)}),
                                     run("lu", {"a": b}, valid=False)]}))
    assert "| barrier | 2 | gang 71%, none 29% | 1 | 1.0 | met |" in text
    assert "| blocking | 2 | gang 50%, none 50% | 5 | 5.0 | not met |" in text
    assert "| lu | 2 | gang 100% | 0 | 0.0 | invalid |" in text
    assert steady({"runs": []}) == []


def test_phase_changes_are_reported_per_guest():
    from benchmarks.report import phases
    ph = lambda kind, before, after, t: {"kind": kind, "rate": 100.0 if kind == "barrier" else 10.0, "start_s": 0.0,  # noqa: E731
                                         "mode_before": before, "mode_settled": after, "follow_s": t}
    run = lambda mode, per_guest: {"workload": "phases", "mode": mode, "phase_ms": 20000, "per_guest": per_guest}  # noqa: E731
    text = "\n".join(phases({"runs": [
        run("cfs", {"a": {"phases": [ph("blocking", None, None, 0.0)]}, "b": {"phases": []}}),
        run("auto", {"a": {"phases": [ph("blocking", "gang", "none", 2.0), ph("barrier", "none", "gang", 1.5)]},
                     "b": {"phases": [ph("blocking", "none", "none", 0.0)]}})]}))
    assert "| auto | 100 (1) | 10 (2) | - |" in text and "| cfs | - (0) | 10 (1) | - |" in text
    assert "auto, per guest and phase: a: blocking gang→none in 2.0 s, barrier none→gang in 1.5 s; b: blocking kept none." in text
    assert phases({"runs": []}) == []
    covered = {"a": {"phases": [{**ph("barrier", "gang", "gang", 0.0), "coverage": 0.99},
                                {**ph("blocking", "gang", "none", 2.0), "coverage": 0.9}]}}
    assert "| auto | 100 (1) | 10 (1) | 90% |" in "\n".join(phases({"runs": [run("auto", covered)]}))


def test_a_phase_is_measured_over_the_guest_time_its_lines_span():
    from benchmarks.suite import phase_figures
    # phases of 1 s: lines every 0.1 s, but the second phase's lines stop 0.5 s early (its guest held back)
    lines = [{"phase": 0, "t_ms": t, "iters": t} for t in range(0, 1000, 100)]
    lines += [{"phase": 1, "t_ms": t, "iters": 2 * t} for t in range(1000, 1500, 100)]
    lines += [{"phase": 2, "t_ms": t, "iters": 3 * t} for t in range(2000, 3000, 100)]
    lines += [{"phase": 3, "t_ms": 3000, "iters": 0}]
    timeline = [(float(i), {"g": i}, {"g": "gang"}) for i in range(len(lines) + 1)]
    (second, third), = [phase_figures(lines, timeline, "g", phase_ms=1000)["phases"]]
    assert second["kind"] == "blocking" and second["coverage"] == pytest.approx(0.4)
    assert second["rate"] == pytest.approx(2000.0)      # over the span its lines cover
    assert third["coverage"] == pytest.approx(0.9)


def test_cpu_bound_gives_the_cpus_to_the_guests_needing_fewest_first():
    from benchmarks.report import cpu_bound
    assert cpu_bound([1.0, 2.0, 2.0], 2) == 1.5          # one busy thread: a whole CPU buys it all of itself
    assert cpu_bound([0.5, 0.5], 2) == 2.0               # room for both
    assert cpu_bound([2.0, 2.0, 2.0], 2) == 1.0


def test_mixed_rows_are_told_apart_by_name_and_judged_on_medians():
    from benchmarks.report import mixed
    def run(unit, mode, rates, rep):
        return {"workload": "mixed", "unit": unit, "guests": 2, "mode": mode, "rep": rep, "valid": True,
                "alone": {"a": 10.0, "b": 10.0}, "alone_cpus": {"a": 1.0, "b": 2.0}, "cpus": 2,
                "guest_workloads": {"a": "ep threads=1", "b": "barrier"},
                "per_guest": {"a": {"rate": rates[0]}, "b": {"rate": rates[1]}},
                "modes": {"end": {"a": "none+slot" if mode == "auto" else mode, "b": "gang"}}}
    runs = [run(u, m, r, rep) for u in ("mixed busy-x2", "mixed x2") for rep, r in enumerate(((5, 2), (4, 3), (9, 9)))
            for m in ("cfs", "auto")]
    text = "\n".join(mixed({"runs": runs}))
    assert "mixed busy-x2 (2 guests)" in text and "mixed x2 (2 guests)" in text
    assert "| cfs | 0.50 | 0.30 | 0.80 |" in text                  # medians of (0.5, 0.4, 0.9) and (0.2, 0.3, 0.9)
    assert "CPU time allows a sum of at most 1.50" in text and "ep threads=1 none+slot" in text
    # the floor names its guest and the mode it is measured against
    assert "the guest auto serves worst (ep threads=1) gets 1.00× its own best static policy (cfs)" in text


def test_each_mixed_row_names_the_slots_auto_laid_out_and_how_often():
    from benchmarks.report import mixed
    gang = {"cell": "c0", "kind": "gang", "cpus": [0, 1], "cycle_ms": 130, "slots": [
        {"domain": "g-b", "mode": "gang", "slot_ms": 30, "hosted": False, "turn": 0},
        {"domain": "g-a", "mode": "none", "slot_ms": 100, "hosted": True, "turn": 1},
        {"domain": "g-c", "mode": "none", "slot_ms": 100, "hosted": True, "turn": 1}]}
    def run(rep, layout):
        return {"workload": "mixed", "unit": "mixed busy2-x3", "guests": 3, "mode": "auto", "rep": rep, "valid": True,
                "alone": {n: 10.0 for n in ("g-a", "g-b", "g-c")},
                "guest_workloads": {"g-a": "ep threads=1", "g-b": "barrier", "g-c": "deadline threads=1"},
                "per_guest": {n: {"rate": 5.0} for n in ("g-a", "g-b", "g-c")},
                "modes": {"end": {}}, "layout": layout}
    text = "\n".join(mixed({"runs": [run(0, {"cells": [gang], "free": []}), run(1, {"cells": [gang], "free": []}),
                                     run(2, {"cells": [], "free": ["g-a", "g-b", "g-c"]})]}))
    assert ("- cell c0 (gang, CPUs 0,1, cycle 130 ms): barrier gang 30 ms → "
            "ep threads=1 + deadline threads=1 none+slot 100 ms (in 2 of 3)") in text
    assert "- free: ep threads=1, barrier, deadline threads=1 (in 1 of 3)" in text


def test_each_mixed_row_says_whether_auto_was_tuned_on_it():
    from benchmarks.report import mixed
    from benchmarks.suite import HELD_OUT, MIXED
    assert HELD_OUT and HELD_OUT < set(MIXED) and set(MIXED) - HELD_OUT    # both sets are run
    run = lambda unit, held: {"workload": "mixed", "unit": unit, "guests": 1, "mode": "cfs", "rep": 0,  # noqa: E731
                              "valid": True, "alone": {"a": 1.0}, "guest_workloads": {"a": "pigz"},
                              "per_guest": {"a": {"rate": 1.0}}, "held_out": held}
    text = "\n".join(mixed({"runs": [run("mixed software-x1", True), run("mixed x1", False)]}))
    assert "mixed software-x1 (1 guests; held out: auto's thresholds were never tuned on it)" in text
    assert "mixed x1 (1 guests; tuning set: auto's thresholds were set on it)" in text
