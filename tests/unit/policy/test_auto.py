"""auto's classifier on synthetic sampler streams: steady, noisy, flapping, changing phase."""
import random
from dataclasses import replace

import pytest

from cosched.model import Domain, Host, PolicySpec, Snapshot, Vcpu
from cosched.policy.auto import Auto, Choice, Chooser, Evidence, scores
from cosched.policy.params import MODES, ParamError, resolve
from cosched.policy.plan import PlanConfig, plan
from cosched.sampler import DomainView, VcpuView

ALL = MODES


def barrier(rng=None, held=0.0):
    """Two vCPUs that never idle, fighting other guests for the CPUs (wait or co-stop)."""
    j = rng.uniform(-0.1, 0.1) if rng else 0.0
    return Evidence(1.0, 2, run=0.9 + j, wait=(1.1 - j) * (1 - held), costop=(1.1 - j) * held)


def blocking(rng=None):
    """Two vCPUs that mostly sleep and wait when they wake (the benchmark's
    ``blocking`` guest, four guests on two CPUs: 85% idle)."""
    j = rng.uniform(-0.05, 0.05) if rng else 0.0
    return Evidence(1.0, 2, run=0.17 + j, wait=0.13, costop=0.0)


def pingpong(held=0.0):
    """Two vCPUs handing a message back and forth: each idles while the other
    works or waits for a CPU (kernel traces of four guests on two CPUs,
    the full run of commit 6c4d807, in the tree of commit 6f2d54a under
    ``benchmarks/evidence/full-run-6c4d807/``: per vCPU under the host scheduler
    run 24%, wait 67%, idle 9%; under gang run 18%, co-stopped 74%, idle 6%: a
    quarter of its active time idle either way)."""
    if held:
        return Evidence(1.0, 2, run=0.36, wait=0.04, costop=1.48)
    return Evidence(1.0, 2, run=0.49, wait=1.33)


def sleepers_in(mode: str) -> Evidence:
    """The benchmark's ``blocking`` guest, four of them on two CPUs, as the
    daemon measured one in each mode: under ``boost`` its vCPUs wait more
    (its poll and boosts on the same CPUs), so they idle a smaller share of
    all their time, not of the time they were neither waiting nor
    co-stopped."""
    return {"none": Evidence(1.0, 2, run=0.30, wait=0.32),
            "boost": Evidence(1.0, 2, run=0.28, wait=0.82),
            "gang": Evidence(1.0, 2, run=0.10, wait=0.02, costop=1.5)}[mode]


def lopsided():
    """One vCPU busy and contended, its sibling with nothing to do."""
    return Evidence.of_vcpus(1.0, [(0.5, 0.5, 0.0), (0.0, 0.0, 0.0)])


def quiet():
    return Evidence(1.0, 2, run=0.5, wait=0.01)


def run(stream, seconds, ch=None, allow=ALL, dwell=5, start=0):
    ch = ch or Chooser()
    modes = []
    for t in range(start, start + seconds):
        mode, _ = ch.decide("g", float(t), stream(t), allow, dwell)
        modes.append(mode)
    return ch, modes


def changes(modes):
    return sum(1 for a, b in zip(modes, modes[1:]) if a != b)


def test_signals_do_not_depend_on_the_mode():
    # the same guest under cfs (waits) and under gang (held frozen): same contention, same idleness
    cfs, gang = barrier(held=0.0), barrier(held=1.0)
    assert cfs.contention == pytest.approx(gang.contention) and cfs.idleness == pytest.approx(gang.idleness)
    assert blocking().idleness == pytest.approx(1.7 / 1.87) and barrier().idleness == 0.0
    assert pingpong().idleness == pytest.approx(pingpong(held=1.0).idleness, abs=0.05)
    assert pingpong().idleness == pytest.approx(0.26, abs=0.02)
    assert lopsided().spread == 1.0 and lopsided().idleness == pytest.approx(2 / 3) and barrier().spread == 0.0
    # waiting delays a sleeper's work, it does not make it idle less of its active time
    assert [round(sleepers_in(m).idleness, 2) for m in ("none", "boost", "gang")] == [0.82, 0.76, 0.79]


def test_sleepers_that_wait_more_under_boost_keep_their_mode():
    """Four sleeping guests on two CPUs moved between boost and gang 17
    times in 90 s (docs/decisions/0004-auto-idleness-of-active-time.md) when idleness was
    counted over all their time: 64-66% under the host scheduler, 44-51%
    under boost, where gang then scored best, 65-73% under gang, where
    boost did. Each window's evidence here is a sleeper's in the mode of
    the moment (69%, 45% and 76% of all its time idle); ``allow`` rules
    out ``none``, the sleeper's choice otherwise."""
    for allow, want in ((("boost", "gang"), "boost"), (ALL, "none")):
        ch = Chooser()
        modes = []
        for t in range(120):
            mode, _ = ch.decide("g", float(t), sleepers_in(ch.guests["g"].mode if "g" in ch.guests else "none"),
                                allow, 5)
            modes.append(mode)
        assert set(modes) == {want}, (allow, modes)


@pytest.mark.parametrize("spread", [0.0, 0.4, 1.0])
def test_boost_wins_only_where_allow_rules_out_none_and_coscheduling(spread):
    for contention in (0.0, 0.05, 0.1, 0.15, 0.5, 1.0):
        for idleness in (0.0, 0.3, 0.5, 0.575, 0.6, 0.8, 1.0):
            sc = scores(contention, idleness, "gang", spread)
            assert max(sc["none"], sc["gang"]) >= 0.5 > sc["boost"] > sc["relaxed"] or contention == 0, sc
            assert sc["boost"] >= sc["relaxed"]


@pytest.mark.parametrize("stream,mode", [
    (lambda t: barrier(), "gang"),
    (lambda t: blocking(), "none"),                              # contended, but it mostly sleeps
    (lambda t: Evidence(1.0, 2, run=1.5, wait=0.4), "gang"),      # idles 5%
    (lambda t: Evidence(1.0, 2, run=0.8, wait=0.4), "gang"),      # idles 40%, evenly
    (lambda t: Evidence(1.0, 2, run=0.2, wait=0.2), "none"),      # idles 80%
    (lambda t: pingpong(), "gang"),
    (lambda t: pingpong(held=float(t > 10)), "gang"),             # the same guest, once in gang
    (lambda t: lopsided(), "none"),
    (lambda t: quiet(), "none"),
])
def test_steady_guests_get_their_mode_and_keep_it(stream, mode):
    _, modes = run(stream, 120)
    assert modes[-1] == mode
    assert changes(modes) <= 1 and modes.index(mode) <= 5 if mode != "none" else set(modes) == {"none"}


def test_partial_where_the_pool_has_room_for_two_guests():
    ch = Chooser()
    for t in range(10):
        mode, _ = ch.decide("g", float(t), barrier(), ALL, 5, coschedule="partial")
    assert mode == "partial" and scores(1.0, 0.0, "partial")["gang"] < scores(1.0, 0.0, "partial")["partial"]


@pytest.mark.parametrize("seed", range(20))
def test_noisy_steady_guests_change_mode_at_most_once_a_minute(seed):
    rng = random.Random(seed)
    for make in (barrier, blocking):
        _, modes = run(lambda t: make(rng), 600)
        assert changes(modes) <= 10, f"{make.__name__}: {changes(modes)} changes in 10 minutes"
        assert changes(modes[60:]) == 0


def test_a_flapping_stream_does_not_make_the_mode_flap():
    # evidence alternating every window between two kinds of guest
    _, modes = run(lambda t: barrier() if t % 2 else blocking(), 600)
    assert changes(modes) <= 1


def test_a_phase_change_is_followed_within_five_seconds():
    def phases(t):
        return barrier() if (t // 20) % 2 == 0 else blocking()
    _, modes = run(phases, 200)
    for start in range(20, 200, 20):
        want = "gang" if (start // 20) % 2 == 0 else "none"
        took = next(i for i, m in enumerate(modes[start:], 0) if m == want)
        assert took <= 5, f"phase at {start} s: {want} after {took} s"


def test_dwell_time_and_allow_bound_the_choice():
    _, modes = run(lambda t: barrier() if t < 10 else blocking(), 40, dwell=20)
    first = modes.index("gang")
    assert first <= 3                                     # the first choice need not dwell
    assert modes.index("none", first) == first + 20       # the next waits dwell-s
    _, modes = run(lambda t: barrier(), 30, allow=("none", "boost", "relaxed"))
    assert "gang" not in modes and modes[-1] == "boost"   # the best allowed
    _, modes = run(lambda t: blocking(), 30, allow=("boost", "relaxed", "gang"))
    assert modes[-1] == "boost"                           # a sleeper: boost where none may not
    _, modes = run(lambda t: blocking(), 30, allow=("relaxed", "gang"))
    assert modes[-1] == "relaxed"                         # relaxed where boost may not
    ch, _ = run(lambda t: barrier(), 30)
    mode, why = ch.decide("g", 31.0, barrier(), ("boost",), 5)
    assert mode == "boost" and "no longer allowed" in why  # new bounds apply at once


def test_allow_parameter_is_validated():
    assert dict(resolve("auto", {}, {"allow": "gang, boost"}))["allow"] == ("gang", "boost")
    for bad in ("gang,fast", ""):
        with pytest.raises(ParamError, match="allow"):
            resolve("auto", {}, {"allow": bad})


def test_auto_turns_cumulative_figures_into_windows_and_plans_the_mode():
    host = Host(cpus=(0, 1), core_of={0: (0, 0), 1: (0, 1)}, node_of={0: 0, 1: 0}, cgroup="hybrid",
                cgroup2_mount="/sys/fs/cgroup/unified")
    spec = PolicySpec("auto", "auto", resolve("auto", {}, {}), "annotation")
    vcpus = tuple(Vcpu(i, 10 + i, f"/m/g/vcpu{i}", start_time=1) for i in range(2))
    snap = Snapshot(host, (Domain("g", "u", 1, vcpus, spec), Domain("h", "v", 2, vcpus, None, error="bad")))
    auto = Auto()

    def view(t):                                # a barrier guest: run 0.9 s and wait 1.1 s per second
        return {"u": DomainView("u", "g", (VcpuView(0, 10, 0.45 * t, 0.55 * t), VcpuView(1, 11, 0.45 * t, 0.55 * t)),
                                hazard=0.8 * t, partial=0.0, observed=float(t), skew_buckets=(), skew_sum=0.0,
                                skew_count=0, last_skew=0.0)}
    seen = []
    for t in range(12):
        seen += auto.step(float(t), snap, view(t), {}, pool_cpus=2)
    assert [(name, old, new) for name, old, new, _ in seen] == [("g", "none", "gang")]
    eff, settled = auto.settle(snap, lambda s: plan(s, PlanConfig()))
    assert [(name, old, new) for name, old, new, _ in settled] == [("g", "none", "gang")]
    assert settled[0][3] == seen[0][3]
    assert eff.domains[0].policy.kind == "gang" and dict(eff.domains[0].policy.params)["quantum-ms"] == 50
    assert eff.domains[0].policy.preset == "auto" and eff.domains[1] == snap.domains[1]
    explained = auto.chooser.explain("u")
    assert explained["mode"] == "gang" and explained["scores"]["gang"] > 0.9
    assert explained["last_window"]["wait"] == pytest.approx(1.1)


def two_vcpus_under_auto(vcpu_views, seconds=12) -> dict:
    """One 2-vCPU guest under auto fed ``vcpu_views(t)`` each second; what ``explain`` says then."""
    host = Host(cpus=(0, 1), core_of={0: (0, 0), 1: (0, 1)}, node_of={0: 0, 1: 0}, cgroup="hybrid",
                cgroup2_mount="/sys/fs/cgroup/unified")
    spec = PolicySpec("auto", "auto", resolve("auto", {}, {}), "annotation")
    vcpus = tuple(Vcpu(i, 10 + i, f"/m/g/vcpu{i}", start_time=1) for i in range(2))
    snap = Snapshot(host, (Domain("g", "u", 1, vcpus, spec),))
    auto = Auto()
    for t in range(seconds):
        auto.step(float(t), snap, {"u": DomainView("u", "g", vcpu_views(t), hazard=0.0, partial=0.0,
                                                   observed=float(t), skew_buckets=(), skew_sum=0.0,
                                                   skew_count=0, last_skew=0.0)}, {}, pool_cpus=2)
    return auto.chooser.explain("u")


def test_auto_measures_each_vcpu_so_a_lopsided_guest_is_not_ganged():
    # vCPU 0 busy and waiting half the time, vCPU 1 idle
    explained = two_vcpus_under_auto(lambda t: (VcpuView(0, 10, 0.5 * t, 0.5 * t), VcpuView(1, 11, 0.0, 0.0)))
    assert explained["mode"] == "none" and explained["last_window"]["spread"] == pytest.approx(1.0)
    assert explained["signals"]["idleness"] == pytest.approx(2 / 3)       # idle 1 s of 1.5 s active


def test_a_vcpu_the_host_starves_counts_as_waiting_not_idle():
    # vCPU 0 runs all the time; vCPU 1 stays queued, a wait the kernel credits only when it ends
    explained = two_vcpus_under_auto(lambda t: (VcpuView(0, 10, 1.0 * t, 0.0), VcpuView(1, 11, 0.0, 0.0, 1.0 * t)))
    assert explained["mode"] == "gang" and explained["last_window"]["idle"] == pytest.approx(0.0)


def test_explain_prints_every_signal_and_the_scores():
    from cosched.render import render_explain
    ch, _ = run(lambda t: lopsided(), 12)
    text = render_explain({"domain": "g", "allow": list(ALL), **ch.explain("g")})
    assert "mode none" in text and "spread 1.00" in text and "idleness 0.67" in text
    assert "none 1.00 *" in text and "boost 0.45" in text and "relaxed 0.36" in text and "gang 0.00" in text


def busy_guests(n: int, vcpus: int = 2, allow=None) -> tuple[Snapshot, Auto]:
    """``n`` guests under auto whose vCPUs never idle and wait as long as they
    run, after twelve one-second decisions on a 2-CPU host."""
    host = Host(cpus=(0, 1), core_of={0: (0, 0), 1: (0, 1)}, node_of={0: 0, 1: 0}, cgroup="hybrid",
                cgroup2_mount="/sys/fs/cgroup/unified")
    spec = PolicySpec("auto", "auto", resolve("auto", {} if allow is None else {"allow": allow}, {}), "annotation")
    domains = tuple(Domain(f"g{k}", f"u{k}", 100 + k, tuple(Vcpu(i, 1000 * k + i, f"/m/g{k}/vcpu{i}", start_time=1)
                                                            for i in range(vcpus)), spec) for k in range(n))
    snap, auto = Snapshot(host, domains), Auto()
    for t in range(12):
        views = {d.uuid: DomainView(d.uuid, d.name, tuple(VcpuView(v.index, v.tid, 0.5 * t, 0.5 * t) for v in d.vcpus),
                                    hazard=0.8 * t, partial=0.0, observed=float(t), skew_buckets=(), skew_sum=0.0,
                                    skew_count=0, last_skew=0.0) for d in domains}
        auto.step(float(t), snap, views, {}, pool_cpus=2)
    return snap, auto


def test_a_guest_the_planner_cannot_take_under_its_choice_runs_the_best_mode_it_can():
    snap, auto = busy_guests(1, vcpus=4)                  # four vCPUs: gang needs a CPU for each
    planner = lambda s: plan(s, PlanConfig())             # noqa: E731
    eff, changes = auto.settle(snap, planner)
    assert auto.chooser.mode("u0") == "gang" and auto.mode("u0") == "boost"
    assert eff.domains[0].policy.kind == "boost" and planner(eff).rejected == {}
    [(name, old, new, why)] = changes
    assert (name, old, new) == ("g0", "none", "boost")
    assert why.startswith("gang scores 1.00") and "; the planner cannot take gang (not managed: it has 4 vCPUs but " \
        "the co-scheduling pool has 2 CPUs): boost scores best of the rest" in why
    explained = auto.explain("u0")
    assert explained["mode"] == "boost" and explained["chosen"] == "gang"
    assert sorted(explained["refused"]) == ["gang", "partial"] and "4 vCPUs" in explained["refused"]["gang"]
    assert auto.settle(snap, planner)[1] == []            # settled: nothing changes again


def test_a_guest_that_finds_the_gang_cell_full_waits_outside_it_and_joins_when_there_is_room():
    snap, auto = busy_guests(3)
    planner = lambda s: plan(s, PlanConfig(max_stall_ms=60))    # noqa: E731  room for two 50 ms turns
    eff, changes = auto.settle(snap, planner)
    assert [auto.chooser.mode(d.uuid) for d in snap.domains] == ["gang"] * 3
    assert [auto.mode(d.uuid) for d in snap.domains][:2] == ["gang", "gang"]
    third = auto.mode("u2")
    assert third not in ("gang", "none") and planner(eff).rejected == {}
    assert [c[:3] for c in changes] == [("g0", "none", "gang"), ("g1", "none", "gang"), ("g2", "none", third)]
    assert "the gang cell is full" in changes[2][3]
    fewer = replace(snap, domains=snap.domains[1:])      # g0 shuts down
    eff, changes = auto.settle(fewer, planner)
    assert [c[:3] for c in changes] == [("g2", third, "gang")]
    assert changes[0][3] == "the planner can take gang again" and auto.explain("u2")["refused"] == {}


def test_a_guest_allowed_only_modes_the_planner_cannot_take_is_left_to_the_host():
    snap, auto = busy_guests(1, vcpus=4, allow="gang,relaxed")
    eff, changes = auto.settle(snap, lambda s: plan(s, PlanConfig()))
    assert auto.mode("u0") == "none" and eff.domains[0].policy.kind == "none"
    assert changes == [] and sorted(auto.explain("u0")["refused"]) == ["gang", "relaxed"]


def test_with_every_cpu_reserved_a_busy_guest_is_left_to_the_host():
    snap, auto = busy_guests(1)
    eff, changes = auto.settle(snap, lambda s: plan(s, PlanConfig(reserved_cpus=(0, 1))))
    assert auto.mode("u0") == "none" and changes == []
    assert sorted(auto.explain("u0")["refused"]) == ["boost", "gang", "partial", "relaxed"]


def mixed_host(*kinds: str, seconds: int = 12) -> tuple[Snapshot, Auto]:
    """Guests under auto on a 2-CPU host, fed per vCPU (run, wait) each second
    by kind: ``barrier`` (never idle, waits as long as it runs), ``lopsided``
    (vCPU 0 busy, vCPU 1 with nothing to do; ``lopsided2`` the other way
    round) or ``sleeper`` (idles 80%)."""
    per_second = {"barrier": [(0.5, 0.5), (0.5, 0.5)], "lopsided": [(0.5, 0.5), (0.0, 0.0)],
                  "lopsided2": [(0.0, 0.0), (0.5, 0.5)], "sleeper": [(0.15, 0.1), (0.15, 0.1)]}
    host = Host(cpus=(0, 1), core_of={0: (0, 0), 1: (0, 1)}, node_of={0: 0, 1: 0}, cgroup="hybrid",
                cgroup2_mount="/sys/fs/cgroup/unified")
    spec = PolicySpec("auto", "auto", resolve("auto", {}, {}), "annotation")
    domains = tuple(Domain(kind, f"u-{kind}", 100 + k, tuple(Vcpu(i, 1000 * k + i, f"/m/{kind}/vcpu{i}", start_time=1)
                                                             for i in range(2)), spec) for k, kind in enumerate(kinds))
    snap, auto = Snapshot(host, domains), Auto()
    for t in range(seconds):
        views = {d.uuid: DomainView(d.uuid, d.name, tuple(VcpuView(i, 1000 * k + i, r * t, w * t)
                                                          for i, (r, w) in enumerate(per_second[d.name])),
                                    hazard=0.0, partial=0.0, observed=float(t), skew_buckets=(), skew_sum=0.0,
                                    skew_count=0, last_skew=0.0) for k, d in enumerate(domains)}
        auto.step(float(t), snap, views, {}, pool_cpus=2)
    return snap, auto


def test_a_busy_guest_left_to_the_host_is_hosted_beside_a_gang_and_a_sleeper_runs_free():
    snap, auto = mixed_host("barrier", "lopsided", "sleeper")
    planner = lambda s: plan(s, PlanConfig())             # noqa: E731
    eff, _ = auto.settle(snap, planner)
    assert [auto.mode(d.uuid) for d in snap.domains] == ["gang", "none", "none"]
    assert auto.hosted == {"u-lopsided": 1.0}         # it keeps one vCPU busy
    # its turn: by CPU time twice a gang slot, on the one CPU it can use; kept to 60 ms, so that the
    # barrier guest keeps 90% of the half of the cycle it would have beside a gang guest (50/110 of 50/100)
    p = planner(eff)
    assert [(s["domain"], s["mode"], s["hosted"]) for s in p.composition()[0]["slots"]] == [
        ("barrier", "gang", False), ("lopsided", "none", True)]
    assert [s["slot_ms"] for s in p.composition()[0]["slots"]] == [50, 60]
    assert p.cell_of("u-sleeper") is None and p.rejected == {}
    assert auto.explain("u-lopsided")["hosted"] and not auto.explain("u-sleeper")["hosted"]


def test_without_a_gang_a_busy_guest_left_to_the_host_runs_free():
    snap, auto = mixed_host("lopsided", "sleeper")
    eff, changes = auto.settle(snap, lambda s: plan(s, PlanConfig()))
    assert auto.hosted == {} and changes == []
    assert [d.policy.kind for d in eff.domains] == ["none", "none"]


def test_explain_shows_the_host_composition():
    from cosched.render import render_explain
    snap, auto = mixed_host("barrier", "lopsided", "sleeper")
    eff, _ = auto.settle(snap, lambda s: plan(s, PlanConfig()))
    p = plan(eff, PlanConfig())
    text = render_explain({"domain": "lopsided", "allow": list(ALL), **auto.explain("u-lopsided"),
                           "host": {"cells": p.composition(), "free": ["sleeper"]}})
    assert "runs in the turn the hosted guests share beside the gang guests" in text
    assert "cell gang (gang, CPUs 0,1, cycle 110 ms): barrier (gang, 50 ms), lopsided (none, hosted, 60 ms)" in text
    assert "free under the host scheduler: sleeper" in text


def test_two_busy_guests_left_to_the_host_share_one_turn_beside_a_gang():
    snap, auto = mixed_host("barrier", "lopsided", "lopsided2")
    eff, _ = auto.settle(snap, lambda s: plan(s, PlanConfig()))
    assert auto.hosted == {"u-lopsided": 1.0, "u-lopsided2": 1.0}
    (cell,) = plan(eff, PlanConfig()).cells
    # each keeps one CPU busy: together they fill the pool, in one turn instead of two of 100 ms
    assert [[cell.members[i].name for i in t] for t in cell.turns] == [["barrier"], ["lopsided", "lopsided2"]]
    assert cell.cycle_ms == 150 and [m.slot_ms for m in cell.members] == [50, 100, 100]
    from cosched.render import render_explain
    text = render_explain({"domain": "lopsided", "allow": list(ALL), **auto.explain("u-lopsided"),
                           "host": {"cells": plan(eff, PlanConfig()).composition(), "free": []}})
    assert ("cycle 150 ms): barrier (gang, 50 ms), lopsided (none, hosted, 100 ms) + lopsided2 (none, hosted, 100 ms)"
            in text)


@pytest.mark.parametrize("busy, shown", [(0.96, 1.0), (1.0, 1.0), (1.26, 1.3), (None, 1.0)])
def test_a_guests_busy_figure_goes_to_the_planner_to_a_tenth(busy, shown):
    ch = Chooser()
    ch.guests["g"] = Choice(busy=busy)
    assert ch.busy("g") == shown and Chooser().busy("unknown") == 1.0


def test_a_guest_the_platform_gave_dedicated_cpus_is_left_to_none_with_the_reason():
    from cosched.model import CpuTune
    snap, auto = busy_guests(2)
    pinned = replace(snap.domains[0], cputune=CpuTune(pins=((0, (0,)), (1, (1,)))))
    snap = replace(snap, domains=(pinned, snap.domains[1]))
    eff, changes = auto.settle(snap, lambda s: plan(s, PlanConfig()))
    assert auto.chooser.mode("u0") == "gang" and auto.mode("u0") == "none"
    assert "dedicated CPUs" in auto.explain("u0")["refused"]["gang"]
    assert changes == [] and [d.policy.kind for d in eff.domains] == ["none", "none"]
    # g0 holds both CPUs of this host: none is left for g1 to be co-scheduled on
    assert "the co-scheduling pool has 0 CPUs" in auto.explain("u1")["refused"]["gang"]
