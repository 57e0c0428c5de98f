"""The switcher's messages survive their line of JSON, every field and nested record alike."""
from __future__ import annotations

import json
from dataclasses import asdict

from cosched.actuators.sched import SchedAttr
from cosched.policy.plan import Cell, Member, PlannedVcpu
from cosched.switcher import protocol as pr


def messages():
    vcpu = PlannedVcpu(0, 11, 5, 1, "/cg/vcpu0/cgroup.freeze", ("/cg/cpu.rt_runtime_us",))
    member = Member("uuid-1", "vm1", 50, 1, (vcpu,), rt_vcpu_us=100, boost_ms=2, hosted=True)
    cell = Cell("gang", "freeze", (0, 1), (member,), note="boost off", kind="gang")
    return [
        pr.Orders(seq=3, max_stall_ms=500, rt_top_us=None, cells=(cell,), max_boosted=2,
                returns=(pr.VcpuReturn(11, SchedAttr("other", nice=-5), 123),)),
        pr.Stats(switches={"gang": 2}, latency_ns=[300_000], lateness_ns=[100_000], costop={("uuid-1", 0): 0.0012},
                 costops={("uuid-1", 0): 1}, boosts={("uuid-1", 0): 2, ("uuid-1", 1): 1}, forced_thaws=1,
                 long_waits_held={"room": 2}, long_waits_reported=3, errors=["x"], error_count=1,
                 active={"gang": "uuid-1"}, boost_failed={"gang": "why"}, released=True, released_by=9,
                 rt_stranded_us=4, admission_wrong=False),
        pr.Ready(True), pr.Applied(4), pr.Stop(),
    ]


def test_each_message_is_one_line_that_decodes_to_itself():
    for msg in messages():
        line = pr.encode(msg)
        assert line.endswith("\n") and "\n" not in line[:-1]
        assert pr.decode(line) == msg
        fields = msg.to_json() if isinstance(msg, pr.Stats) else asdict(msg)
        assert json.loads(line) == json.loads(json.dumps(fields))     # the fields as asdict (to_json) gives them


def test_the_engine_adds_up_what_each_report_counts_and_keeps_the_last_state():
    one = pr.Stats(switches={"gang": 2}, latency_ns=[300_000, 2_000_000], costop={("u", 0): 0.5}, errors=["x"],
                   error_count=1, long_waits_held={"room": 1}, active={"gang": "u"}, released_by=5, admission_wrong=True)
    two = pr.Stats(switches={"gang": 1, "partial-0": 4}, lateness_ns=[50_000], costop={("u", 0): 0.25, ("v", 1): 1.0},
                   boosts={("v", 1): 3}, errors=["y"], error_count=1, long_waits_held={"room": 2, "stale": 1},
                   active={"gang": "w"}, released_by=3)
    total = pr.Stats(journal_damage=2)
    for report in (one, two):
        total.add(pr.decode(pr.encode(report)))
    assert total.switches == {"gang": 3, "partial-0": 4} and total.costop == {("u", 0): 0.75, ("v", 1): 1.0}
    assert total.boosts == {("v", 1): 3} and total.long_waits_held == {"room": 3, "stale": 1}
    assert sum(total.latency.counts) == 2 and total.latency.quantile(0.99) == 0.002 and sum(total.lateness.counts) == 1
    assert total.latency_ns == [] and total.errors == ["x", "y"] and total.error_count == 2
    assert total.active == {"gang": "w"} and total.released_by == 5 and total.admission_wrong is True
    assert total.journal_damage == 2                                     # the engine's own


def test_a_switchers_record_starts_again_from_nothing_once_taken():
    s = pr.Stats()
    s.count(s.costop, ("u", 0, 11, "/cg"), 0.5)
    s.hold("room")
    s.error("x")
    taken = s.take()
    assert taken.costop == {("u", 0): 0.5} and taken.long_waits_held == {"room": 1} and taken.error_count == 1
    assert s == pr.Stats()
