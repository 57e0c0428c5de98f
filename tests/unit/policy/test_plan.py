"""The planner on synthetic hosts from 2 to 256 CPUs."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cosched.model import Domain, Host, PolicySpec, Snapshot, Vcpu
from cosched.policy.params import resolve
from cosched.policy.plan import FREEZE, HOSTED, PlanConfig, hosted_turn_ms, plan, pool_order


def host(cpus=2, smt=1, nodes=1, rt=False, rt_budget_us=None):
    per_node = cpus // nodes
    return Host(cpus=tuple(range(cpus)), core_of={c: (c // per_node, c // smt) for c in range(cpus)},
                node_of={c: c // per_node for c in range(cpus)}, cgroup="hybrid",
                cgroup2_mount="/sys/fs/cgroup/unified", cpu_v1_mount="/sys/fs/cgroup/cpu", rt_group_sched=rt,
                rt_budget_us=rt_budget_us)


def dom(name, kind="gang", vcpus=2, **params):
    spec = PolicySpec(kind, kind, resolve(kind, {}, {k.replace("_", "-"): v for k, v in params.items()}), "annotation")
    tid0 = abs(hash(name)) % 100000 * 10
    vs = tuple(Vcpu(i, tid0 + i, f"/machine/{name}/vcpu{i}", f"/machine/{name}/vcpu{i}", start_time=1) for i in range(vcpus))
    return Domain(name, f"uuid-{name}", 1, vs, spec)


def snap(h, *domains):
    return Snapshot(h, tuple(domains))


def test_three_gang_guests_share_one_cell():
    p = plan(snap(host(2), dom("a"), dom("b"), dom("c")), PlanConfig())
    (cell,) = p.cells
    assert cell.mode == FREEZE and cell.cpus == (0, 1)
    assert [m.name for m in cell.members] == ["a", "b", "c"]
    assert cell.cycle_ms == 150 and cell.max_stall_ms == 100
    assert all(m.priority == 1 for m in cell.members)
    # balance scheduling: siblings on distinct CPUs
    assert all(sorted(v.cpu for v in m.vcpus) == [0, 1] for m in cell.members)
    assert cell.members[0].vcpus[0].freeze == "/sys/fs/cgroup/unified/machine/a/vcpu0/cgroup.freeze"


def test_guest_larger_than_pool_is_rejected_not_half_managed():
    p = plan(snap(host(2), dom("big", vcpus=4), dom("ok")), PlanConfig())
    assert "big" not in [m.name for c in p.cells for m in c.members]
    assert "4 vCPUs" in p.rejected["uuid-big"] and "2 CPUs" in p.rejected["uuid-big"]


def test_reserved_cpus_never_used():
    p = plan(snap(host(8), dom("a"), dom("b", kind="partial"), dom("c", kind="boost")), PlanConfig(reserved_cpus=(0, 1)))
    used = {v.cpu for c in p.cells for m in c.members for v in m.vcpus}
    assert used and not used & {0, 1}
    assert not any(set(c.cpus) & {0, 1} for c in p.cells)


def test_max_stall_admission():
    guests = [dom(n, quantum_ms=200) for n in "abcd"]
    p = plan(snap(host(2), *guests), PlanConfig(max_stall_ms=500))
    (cell,) = p.cells
    assert [m.name for m in cell.members] == ["a", "b", "c"]       # 3 x 200: frozen 400 ms
    assert "max_stall_ms 500" in p.rejected["uuid-d"] and cell.max_stall_ms <= 500


def test_weight_scales_the_slot():
    p = plan(snap(host(2), dom("a", weight=3), dom("b")), PlanConfig())
    slots = {m.name: m.slot_ms for m in p.cells[0].members}
    assert slots == {"a": 150, "b": 50}


def test_lone_member_is_not_boosted_but_costopped_as_relaxed():
    p = plan(snap(host(2), dom("a")), PlanConfig())
    (cell,) = p.cells
    assert cell.members[0].priority == 0 and cell.max_stall_ms == 0
    assert (cell.mode, cell.kind, p.mode_of("uuid-a")) == ("relaxed", "gang", "gang")
    assert cell.note.startswith("a alone in its gang cell") and "co-stopped as under relaxed" in cell.note
    assert (cell.members[0].costop_ms, cell.members[0].costart_ms) == (3, 2)
    assert sorted(p.pins().values()) == [0, 1]                   # still pinned, siblings apart


def test_partial_packs_into_separate_cells_then_time_shares():
    h = host(4)
    p = plan(snap(h, dom("a", kind="partial"), dom("b", kind="partial"), dom("c", kind="partial")), PlanConfig())
    cells = {c.id: c for c in p.cells}
    assert len(cells) == 2
    assert set(cells["partial-0"].cpus).isdisjoint(cells["partial-1"].cpus)
    sizes = sorted(len(c.members) for c in cells.values())
    assert sizes == [1, 2]


def test_partial_first_fit_decreasing_by_size():
    p = plan(snap(host(6), dom("small", kind="partial", vcpus=1), dom("big", kind="partial", vcpus=4),
                  dom("mid", kind="partial", vcpus=2)), PlanConfig())
    assert [(c.members[0].name, len(c.cpus)) for c in p.cells] == [("big", 4), ("mid", 2)]
    # no free CPU left: the small guest time-shares the least-loaded cell that fits
    assert [m.name for m in p.cells[0].members] == ["big", "small"] and not p.rejected


def test_spread_over_cores_before_smt_siblings():
    h = host(8, smt=2)
    order = pool_order(h, ())
    assert [h.core_of[c] for c in order[:4]] == sorted({h.core_of[c] for c in range(8)})
    (cell,) = plan(snap(h, dom("a", kind="partial")), PlanConfig()).cells
    assert h.core_of[cell.cpus[0]] != h.core_of[cell.cpus[1]]


def test_numa_cells_stay_on_one_node():
    h = host(16, smt=2, nodes=2)
    p = plan(snap(h, *[dom(f"g{i}", kind="partial", vcpus=4) for i in range(4)]), PlanConfig())
    for c in p.cells:
        assert len({h.node_of[cpu] for cpu in c.cpus}) == 1


def test_boost_and_relaxed_guests_are_watched_alone_never_pinned_or_rotated():
    p = plan(snap(host(4, rt=True), dom("a", kind="boost"), dom("b", kind="relaxed"), dom("c", kind="boost", boost_ms=5, pause_ms=3)),
             PlanConfig(reserved_cpus=(0,)))
    assert [(c.id, c.mode, c.kind, len(c.members)) for c in p.cells] == [
        ("boost-a", "boost", "boost", 1), ("relaxed-b", "relaxed", "relaxed", 1), ("boost-c", "boost", "boost", 1)]
    assert all(c.max_stall_ms == 0 and c.cpus == () for c in p.cells)
    assert p.pins() == {("uuid-b", 0): 1, ("uuid-b", 1): 2}        # relaxed only: siblings apart, off reserved
    assert [(c.members[0].boost_ms, c.members[0].pause_ms) for c in p.cells] == [(2, 0), (2, 0), (5, 3)]
    b = p.cells[1].members[0]
    assert (b.costop_ms, b.costart_ms) == (3, 2) and all(v.freeze for v in b.vcpus)
    assert p.max_boosted == 3 and p.mode_of("uuid-b") == "relaxed" and p.mode_of("nobody") is None
    # relaxed co-stops by freezing, so it needs per-vCPU cgroups; boost does not
    bare = lambda d: Domain(d.name, d.uuid, 1, tuple(Vcpu(v.index, v.tid) for v in d.vcpus), d.policy)
    p = plan(snap(host(2), bare(dom("r", kind="relaxed")), bare(dom("s", kind="boost"))), PlanConfig())
    assert "per-vCPU cgroups" in p.rejected["uuid-r"] and p.mode_of("uuid-s") == "boost"


@given(cpus=st.integers(1, 16), sizes=st.one_of(
    st.lists(st.integers(1, 16), min_size=1, max_size=12),
    st.tuples(st.integers(1, 16), st.integers(2, 12)).map(lambda nk: [nk[0]] * nk[1])))
@settings(max_examples=300, deadline=None)
def test_relaxed_guests_spread_their_vcpus_and_each_vcpu_index_evenly(cpus, sizes):
    guests = [dom(f"g{k:02}", kind="relaxed", vcpus=min(n, cpus)) for k, n in enumerate(sizes)]
    pins = plan(snap(host(cpus), *guests), PlanConfig()).pins()
    assert len(pins) == sum(len(g.vcpus) for g in guests)
    for g in guests:                                     # siblings apart
        assert len({pins[(g.uuid, v.index)] for v in g.vcpus}) == len(g.vcpus)
    load = [sum(1 for c in pins.values() if c == cpu) for cpu in range(cpus)]
    assert max(load) - min(load) <= 1, load
    if len({len(g.vcpus) for g in guests}) == 1:         # guests alike: each index spread as evenly
        for i in range(len(guests[0].vcpus)):
            on = [sum(1 for g in guests if pins[(g.uuid, i)] == cpu) for cpu in range(cpus)]
            assert max(on) - min(on) <= 1, (i, on)


def test_relaxed_guests_that_fill_the_pool_do_not_all_put_vcpu_0_on_one_cpu():
    # filled in order, every 2-vCPU guest on 2 CPUs had vCPU 0 on CPU 0
    p = plan(snap(host(2), *(dom(n, kind="relaxed") for n in "abcd")), PlanConfig())
    assert [p.pins()[(f"uuid-{n}", 0)] for n in "abcd"] == [0, 1, 0, 1]
    p = plan(snap(host(4), *(dom(n, kind="relaxed") for n in "abcd")), PlanConfig())
    assert [p.pins()[(f"uuid-{n}", 0)] for n in "abcd"] == [0, 2, 1, 3]


def test_with_every_cpu_reserved_boost_is_refused_not_left_to_poll_for_nothing():
    p = plan(snap(host(2), dom("b", kind="boost")), PlanConfig(reserved_cpus=(0, 1)))
    assert p.cells == () and "pool is empty" in p.rejected["uuid-b"] and p.max_boosted == 0


def test_relaxed_thresholds_must_leave_a_gap():
    import pytest
    from cosched.policy.params import ParamError
    with pytest.raises(ParamError, match="costart-ms"):
        dom("a", kind="relaxed", costop_ms=3, costart_ms=3)
    # only costop-ms given: it is the culprit, not the default costart-ms it clashes with
    with pytest.raises(ParamError) as e:
        dom("a", kind="relaxed", costop_ms=1)
    assert e.value.param == "costop-ms" and "above costart-ms (2)" in str(e.value)


def test_priority_stays_below_the_switcher():
    (cell,) = plan(snap(host(2), dom("a", priority=99), dom("b")), PlanConfig(switcher_priority=50)).cells
    assert max(m.priority for m in cell.members) == 49


def test_rt_group_sched_budget_turns_boost_off_when_too_small():
    p = plan(snap(host(2, rt=True, rt_budget_us=950_000), dom("a"), dom("b"), dom("c")), PlanConfig())
    (cell,) = p.cells
    assert all(m.priority == 0 for m in cell.members) and "freeze-only" in cell.note
    # a big enough budget (e.g. longer cycles on bigger hosts) keeps boosts on
    p = plan(snap(host(2, rt=True, rt_budget_us=950_000 * 10), dom("a"), dom("b"), dom("c")), PlanConfig())
    assert all(m.priority == 1 and m.rt_vcpu_us for m in p.cells[0].members)
    assert p.cells[0].members[0].vcpus[0].rt_chain[-1] == "/sys/fs/cgroup/cpu/machine/a/vcpu0/cpu.rt_runtime_us"


def test_relaxed_boosts_get_rt_runtime_where_rt_group_scheduling_needs_it():
    # pinned for balance, a relaxed vCPU cannot take SCHED_DEADLINE; its FIFO boosts need a grant
    h = host(2, rt=True, rt_budget_us=950_000)
    p = plan(snap(h, dom("a", kind="relaxed"), dom("b", kind="relaxed", boost=False)), PlanConfig())
    a, b = (c.members[0] for c in sorted(p.cells, key=lambda c: c.id))
    assert a.boost_ms and a.rt_vcpu_us == 950_000 // 2        # boost is on by default
    assert a.vcpus[1].rt_chain[-1] == "/sys/fs/cgroup/cpu/machine/a/vcpu1/cpu.rt_runtime_us"
    assert not b.boost_ms and b.rt_vcpu_us is None and b.vcpus[0].rt_chain == ()
    # without RT group scheduling nothing is granted
    (a,) = (c.members[0] for c in plan(snap(host(2), dom("a", kind="relaxed")), PlanConfig()).cells)
    assert a.boost_ms and a.rt_vcpu_us is None


def test_invalid_and_none_guests_are_not_planned():
    bad = Domain("bad", "uuid-bad", 1, dom("x").vcpus, None, error="annotation attribute 'x': bad")
    p = plan(snap(host(2), bad, dom("n", kind="none")), PlanConfig())
    assert p.cells == () and p.rejected == {}


def test_vcpus_without_their_own_cgroup_are_not_frozen():
    d = dom("a")
    d = Domain(d.name, d.uuid, 1, tuple(Vcpu(v.index, v.tid) for v in d.vcpus), d.policy)
    p = plan(snap(host(2), d, dom("b")), PlanConfig())
    assert "per-vCPU cgroups" in p.rejected["uuid-a"]


@settings(max_examples=150, deadline=None)
@given(cpus=st.sampled_from([2, 4, 8, 16, 64, 256]), smt=st.sampled_from([1, 2]),
       guests=st.lists(st.tuples(st.sampled_from(["gang", "partial", "boost", "relaxed"]), st.integers(1, 8),
                                 st.integers(1, 200), st.integers(1, 4)), max_size=40),
       max_stall=st.integers(10, 2000), reserved=st.integers(0, 3))
def test_plan_invariants(cpus, smt, guests, max_stall, reserved):
    h = host(cpus, smt=smt if cpus >= 2 else 1)
    params = {"gang": lambda q, w: {"quantum_ms": q, "weight": w}, "partial": lambda q, w: {"quantum_ms": q, "weight": w},
              "boost": lambda q, w: {"boost_ms": min(q, 100)}, "relaxed": lambda q, w: {"costop_ms": min(q, 99) + 1, "costart_ms": min(q, 99)}}
    ds = [dom(f"g{i}", kind=k, vcpus=v, **params[k](q, w)) for i, (k, v, q, w) in enumerate(guests)]
    cfg = PlanConfig(reserved_cpus=tuple(range(reserved)), max_stall_ms=max_stall)
    p = plan(snap(h, *ds), cfg)
    placed = [m.uuid for c in p.cells for m in c.members]
    assert len(placed) == len(set(placed))                       # one cell per guest
    assert set(placed) | set(p.rejected) == {d.uuid for d in ds}   # every guest planned or told why
    for c in p.cells:
        assert c.max_stall_ms <= max_stall                       # never frozen past max-stall
        assert not set(c.cpus) & set(cfg.reserved_cpus)
        for m in c.members if c.mode in (FREEZE, "relaxed") else ():
            assert len({v.cpu for v in m.vcpus}) == len(m.vcpus)   # siblings on distinct CPUs
            assert c.mode == "relaxed" or {v.cpu for v in m.vcpus} <= set(c.cpus)
    cells = [c for c in p.cells if c.kind == "partial"]
    cpus_used = [cpu for c in cells for cpu in c.cpus]
    assert len(cpus_used) == len(set(cpus_used))                 # partial cells are disjoint
    assert p.max_boosted == max(cpus - reserved, 0)                     # never more watched boosts than pool CPUs
    assert all(len(c.members) == 1 and c.cpus == () for c in p.cells if c.kind in ("boost", "relaxed"))
    assert all(len(c.members) == 1 for c in p.cells if c.mode != FREEZE)     # lone gang/partial: co-stopped
    relaxed = [v.cpu for c in p.cells if c.kind == "relaxed" for v in c.members[0].vcpus]
    if relaxed:                                                  # balance: CPUs evenly loaded
        load = [relaxed.count(cpu) for cpu in range(reserved, cpus)]
        assert max(load) - min(load) <= 1 and not set(relaxed) & set(cfg.reserved_cpus)


def hosted(name, vcpus=2, busy=None):
    """An auto guest left to the host scheduler but busy, as auto hands it to
    the planner (``busy``: the vCPUs' worth it keeps busy; None: all)."""
    d = dom(name, vcpus=vcpus)
    params = resolve("gang", {}, {}) + ((("busy", busy),) if busy is not None else ())
    return d.__class__(**{**d.__dict__, "policy": PolicySpec("auto", HOSTED, params, "annotation")})


@pytest.mark.parametrize("busy, pool, turn", [([1.0], 2, 100), ([1.28], 2, 80), ([2.0], 2, 50), ([0.3], 2, 100),
                                              ([3.9], 4, 50), ([1.0], 8, 400), ([0.5], 64, 1000),
                                              ([1.0, 1.0], 2, 100), ([2.0, 2.0], 2, 100), ([1.0, 0.5], 4, 270)])
def test_the_hosted_turn_gives_their_busy_vcpus_the_cpu_time_of_as_many_gang_guests(busy, pool, turn):
    assert hosted_turn_ms([50] * len(busy), busy, pool) == turn


@pytest.mark.parametrize("gang, keep, turn", [([50, 50], 0, 100), ([], 85, 100), ([50, 50], 85, 70),
                                              ([50, 50], 80, 80), ([50, 50], 100, 50), ([50] * 8, 90, 100)])
def test_the_hosted_turn_leaves_the_gang_guests_the_share_they_keep(gang, keep, turn):
    # one busy vCPU on two CPUs would take 100 ms; beside two 50 ms gang slots that leaves each
    # 50/200 of the cycle against 50/150 if the hosted guest rotated as a gang guest: 75% of it
    assert hosted_turn_ms([50], [1.0], 2, gang, keep) == turn


def test_the_strictest_keep_among_the_hosted_guests_bounds_their_turn():
    def keeping(name, pct):
        d = hosted(name, busy=0.5)
        return d.__class__(**{**d.__dict__, "policy": d.policy.__class__(
            d.policy.preset, HOSTED, d.policy.params + (("keep-pct", pct),), d.policy.source)})
    p = plan(snap(host(2), dom("a"), dom("b"), keeping("h1", 0), keeping("h2", 85)), PlanConfig())
    (cell,) = p.cells
    assert [[cell.members[i].name for i in t] for t in cell.turns] == [["a"], ["b"], ["h1", "h2"]]
    # by CPU time alone 200 ms (two quanta on both CPUs, for one CPU's worth of busy vCPUs); kept to 85%
    # of the 50/200 each gang guest would have beside them as gang guests: at most 135 ms, in 10 ms steps
    assert cell.turn_ms(cell.turns[-1]) == 130 and cell.cycle_ms == 230


def test_busy_guests_left_to_the_host_share_one_turn_that_their_busy_vcpus_fill():
    p = plan(snap(host(2), dom("a"), hosted("h1", busy=1.0), hosted("h2", busy=1.0)), PlanConfig())
    (cell,) = p.cells
    assert [[cell.members[i].name for i in t] for t in cell.turns] == [["a"], ["h1", "h2"]]
    # each keeps one CPU busy: in one 100 ms turn together, both CPUs busy, each gets the CPU time of a
    # gang guest's 50 ms slot, where turns of their own would take 200 ms with a CPU idle
    assert cell.cycle_ms == 150 and cell.max_stall_ms == 100
    assert [s["slot_ms"] for s in p.composition()[0]["slots"]] == [50, 100, 100]
    assert {u for u, _ in p.pins()} == {"uuid-a"} and p.mode_of("uuid-h2") == "none"


def test_a_hosted_guest_that_would_stretch_the_shared_turn_past_the_stall_limit_runs_free():
    # two guests keeping both CPUs busy need a 100 ms turn, which freezes the gang guest 100 ms a cycle:
    # with a 50 ms stall limit only one fits
    p = plan(snap(host(2), dom("a"), hosted("h1"), hosted("h2")), PlanConfig(max_stall_ms=50))
    assert [m.name for m in p.cells[0].members] == ["a", "h1"] and p.rejected == {}


def test_a_busy_guest_left_to_the_host_gets_a_slot_of_its_own_beside_the_gang():
    p = plan(snap(host(2), dom("a"), hosted("busy")), PlanConfig())
    (cell,) = p.cells
    assert cell.mode == FREEZE and [m.name for m in cell.members] == ["a", "busy"]     # it rotates: not lone
    busy = cell.members[1]
    assert busy.hosted and busy.priority == 0 and all(v.cpu == -1 and v.freeze for v in busy.vcpus)
    assert p.mode_of("uuid-busy") == "none" and p.mode_of("uuid-a") == "gang"
    assert {u for u, _ in p.pins()} == {"uuid-a"}                    # the host scheduler places it in its slot
    assert [s["hosted"] for s in p.composition()[0]["slots"]] == [False, True]


def test_a_hosted_guest_without_a_gang_to_protect_or_room_runs_free_and_is_not_rejected():
    assert plan(snap(host(2), hosted("busy")), PlanConfig()) == plan(snap(host(2)), PlanConfig())
    p = plan(snap(host(2), dom("a"), dom("b"), hosted("busy")), PlanConfig(max_stall_ms=60))
    assert [m.name for m in p.cells[0].members] == ["a", "b"] and p.rejected == {}


def test_a_vcpu_cgroup_shared_with_another_task_is_never_frozen():
    d = dom("a")
    d = d.__class__(**{**d.__dict__, "vcpus": (d.vcpus[0].__class__(**{**d.vcpus[0].__dict__, "cgroup_shared": (777,)}),
                                               d.vcpus[1])})
    p = plan(snap(host(2), d, dom("b"), hosted("c")), PlanConfig())
    assert "a" not in [m.name for c in p.cells for m in c.members]
    assert "vCPU 0" in p.rejected["uuid-a"] and "777" in p.rejected["uuid-a"] and "freezing it would stop them" in \
        p.rejected["uuid-a"]


def tuned(d, pins=(), realtime=()):
    """``d`` with the platform's CPU decisions (libvirt's <cputune>)."""
    from cosched.model import CpuTune
    return d.__class__(**{**d.__dict__, "cputune": CpuTune(tuple(pins), tuple(realtime))})


def test_a_guest_on_dedicated_cpus_is_left_alone_and_its_cpus_leave_the_pool():
    p = plan(snap(host(4), tuned(dom("nova", kind="gang"), [(0, (2,)), (1, (3,))]), dom("a"), dom("b")), PlanConfig())
    assert "uuid-nova" not in {m.uuid for c in p.cells for m in c.members}
    assert p.left_alone["uuid-nova"].startswith("dedicated CPUs") and "vCPU 0 on 2" in p.left_alone["uuid-nova"]
    assert p.mode_of("uuid-nova") is None and p.rejected == {}
    assert {v.cpu for c in p.cells for m in c.members for v in m.vcpus} == {0, 1}     # 2 and 3 are the guest's


def test_a_guest_with_realtime_vcpus_is_never_frozen_pinned_or_boosted():
    p = plan(snap(host(2), tuned(dom("rt", kind="boost"), realtime=(0,)), dom("a"), dom("b")), PlanConfig())
    assert "uuid-rt" not in {m.uuid for c in p.cells for m in c.members}
    assert "realtime vCPUs" in p.left_alone["uuid-rt"]
    found = dom("found", kind="gang")                     # no XML says so: its thread ran under SCHED_FIFO
    found = found.__class__(**{**found.__dict__, "vcpus": (found.vcpus[0].__class__(**{
        **found.vcpus[0].__dict__, "realtime": True}), found.vcpus[1])})
    p = plan(snap(host(2), found, dom("a")), PlanConfig())
    assert "vCPU 0 under SCHED_FIFO or SCHED_RR" in p.left_alone["uuid-found"] and p.mode_of("uuid-found") is None


def confined(d, cgroup=None, affinity=None):
    """``d`` confined by its cgroup's cpuset and its threads' first affinity (``{vCPU: CPUs}``)."""
    from dataclasses import replace
    vcpus = tuple(replace(v, cpus=(affinity or {}).get(v.index, ())) for v in d.vcpus)
    return replace(d, vcpus=vcpus, cputune=replace(d.cputune, cgroup_cpus=cgroup))


def cpus_of(p, uuid):
    m = p.member(uuid)
    return [v.cpu for v in m.vcpus] if m else None


def test_a_confined_guest_is_planned_inside_its_cpus_or_not_at_all():
    # pins, a cgroup cpuset and first affinities each confine; together they intersect
    p = plan(snap(host(4), tuned(dom("c"), [(0, (0, 1)), (1, (0, 1))]), dom("a"), hosted("h")), PlanConfig())
    assert sorted(cpus_of(p, "uuid-c")) == [0, 1] and p.mode_of("uuid-c") == "gang" and p.rejected == {}
    p = plan(snap(host(4), confined(dom("c"), cgroup=(1, 3)), dom("a")), PlanConfig())
    assert sorted(cpus_of(p, "uuid-c")) == [1, 3] and cpus_of(p, "uuid-a") == [0, 1]
    # vCPU 1 may run on 2 only, vCPU 0 on 2 or 3: a placement that takes CPUs in order would fail
    p = plan(snap(host(4), confined(dom("c"), affinity={0: (2, 3), 1: (2,)})), PlanConfig())
    assert cpus_of(p, "uuid-c") == [3, 2]
    # two vCPUs on one CPU do not fit: not managed, with the reason, and not mistaken for dedicated
    p = plan(snap(host(4), confined(dom("c"), cgroup=(2,)), dom("a")), PlanConfig())
    assert "uuid-c" not in {m.uuid for c in p.cells for m in c.members} and p.left_alone == {}
    assert "confines it (vCPU 0 to CPU 2, vCPU 1 to CPU 2)" in p.rejected["uuid-c"]
    assert "never pins" in p.rejected["uuid-c"]
    # partial packs it into a cell within its CPUs; relaxed pins it there
    p = plan(snap(host(4), dom("a", kind="partial"), confined(dom("c", kind="partial"), cgroup=(0, 1))), PlanConfig())
    assert sorted(p.cell_of("uuid-c").cpus) == [0, 1] and sorted(cpus_of(p, "uuid-c")) == [0, 1]
    assert sorted(p.cell_of("uuid-a").cpus) == [2, 3]
    p = plan(snap(host(4), dom("a", kind="relaxed"), confined(dom("c", kind="relaxed"), cgroup=(0, 3))), PlanConfig())
    assert sorted(cpus_of(p, "uuid-c")) == [0, 3]
    # a pin that spans the pool changes nothing
    p = plan(snap(host(2), tuned(dom("c"), [(0, (0, 1))]), dom("a")), PlanConfig())
    assert "uuid-c" in {m.uuid for c in p.cells for m in c.members}
    # a 1-vCPU guest whose cgroup allows one CPU is confined, not dedicated: it takes its turns there
    p = plan(snap(host(2), confined(dom("one", vcpus=1), cgroup=(1,)), dom("a")), PlanConfig())
    assert cpus_of(p, "uuid-one") == [1] and p.left_alone == {}


def test_what_the_platform_keeps_cosched_off_is_known_before_any_plan():
    """A guest found as a process is given per-vCPU cgroups only if nothing
    the platform decided keeps cosched off it (``untouchable``)."""
    from cosched.policy.confinement import untouchable
    assert untouchable(dom("a"), host(2)) is None
    assert untouchable(tuned(dom("nova"), [(0, (0,)), (1, (1,))]), host(2)).startswith("dedicated CPUs")
    assert untouchable(tuned(dom("rt"), realtime=(1,)), host(2)).startswith("realtime vCPUs: vCPU 1")
    assert "confines it" in untouchable(confined(dom("narrow"), cgroup=(1,)), host(2))
    assert untouchable(confined(dom("one", vcpus=1), cgroup=(1,)), host(2)) is None
