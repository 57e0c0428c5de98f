"""The resolve step: one plan per snapshot, the one the engine is given."""
from cosched.policy import resolve as r
from cosched.policy.auto import Auto
from cosched.policy.plan import PlanConfig, plan
from tests.unit.policy.test_plan import dom, host, snap


def test_a_snapshot_is_planned_once_and_that_plan_is_the_one_resolved(monkeypatch):
    calls = []
    monkeypatch.setattr(r, "plan", lambda s, cfg: calls.append(s) or plan(s, cfg))
    s = snap(host(2), dom("a"), dom("b"), dom("c", kind="relaxed"))
    got = r.resolve(s, PlanConfig(), Auto())
    assert got.plan == plan(s, PlanConfig()) and got.snapshot == s and got.changes == ()
    assert len(calls) == 1


def test_the_settings_reach_the_planner():
    s = snap(host(4), dom("a"), dom("b"))
    assert r.resolve(s, PlanConfig(reserved_cpus=(2, 3)), Auto()).plan.pool == (0, 1)
