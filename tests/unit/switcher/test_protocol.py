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
        pr.Stats(switches={"gang": 2}, latency_ns=(300_000,), lateness_ns=(100_000,),
                 tallies=(pr.Tally("uuid-1", 0, 1_234_567, 1, 2),), forced_thaws=1,
                 long_waits_held={"room": 2}, long_waits_reported=3, errors=("x",), active={"gang": "uuid-1"},
                 boost_failed={"gang": "why"}, released=True, released_by=9, rt_stranded_us=4, admission_wrong=False),
        pr.Ready(True), pr.Applied(4), pr.Stop(),
    ]


def test_each_message_is_one_line_that_decodes_to_itself():
    for msg in messages():
        line = pr.encode(msg)
        assert line.endswith("\n") and "\n" not in line[:-1]
        assert pr.decode(line) == msg
        assert json.loads(line) == json.loads(json.dumps(asdict(msg)))     # the fields as asdict gives them
