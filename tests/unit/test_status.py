"""Status document, log lines of state changes and metrics health: pure functions."""
import logging

from prometheus_client import CollectorRegistry, generate_latest

from cosched import status
from cosched.switcher.protocol import Stats
from cosched.metrics import CoschedCollector
from cosched.model import Domain, Host, PolicySpec, Snapshot, Vcpu
from cosched.policy.plan import Plan

HOST = Host(cpus=(0, 1), core_of={0: (0, 0), 1: (0, 1)}, node_of={0: 0, 1: 0}, cgroup="hybrid",
            cgroup2_mount="/sys/fs/cgroup/unified")
GANG = PolicySpec("gang", "gang", (("quantum-ms", 50),), "annotation")


def dom(name="vm1", policy=GANG, error=None, vcpus=((0, 11), (1, 12)), warnings=()):
    return Domain(name, f"uuid-{name}", 10, tuple(Vcpu(i, t) for i, t in vcpus), policy, error, warnings)


def snap(*domains, connected=True):
    return Snapshot(HOST, tuple(domains), libvirt_connected=connected)


def test_changes_name_every_state_change_once():
    first = status.changes(None, snap(dom()))
    assert first == [(logging.INFO, "domain=vm1 uuid=uuid-vm1 pid=10 vcpus=2 policy=gang(gang quantum-ms=50) action=found"),
                     (logging.INFO, "domain=vm1 vcpu=0 tid=11 action=vcpu-found"),
                     (logging.INFO, "domain=vm1 vcpu=1 tid=12 action=vcpu-found")]
    assert status.changes(snap(dom()), snap(dom())) == []
    bad = dom(policy=None, error="annotation attribute 'quantum-ms': not a number", vcpus=((0, 11),))
    lines = status.changes(snap(dom()), snap(bad, connected=False))
    assert (logging.INFO, "domain=vm1 policy=- action=policy-changed") in lines
    assert (logging.WARNING, "domain=vm1 action=policy-error error=\"annotation attribute 'quantum-ms': "
                             "not a number\" (observed, not managed)") in lines
    assert (logging.INFO, "domain=vm1 vcpu=1 action=vcpu-gone") in lines
    assert (logging.INFO, "libvirt_connected=False action=libvirt-state") in lines
    assert status.changes(snap(bad), snap()) == [(logging.INFO, "domain=vm1 action=gone")]


def test_document_has_the_contract_keys_and_the_live_state():
    stats = Stats()
    stats.costop[("uuid-vm1", 0)] = 1.5
    live = {("uuid-vm1", 0): {"frozen": True, "sched": "fifo", "priority": 5}}
    doc = status.document(snap(dom()), {}, Plan(), stats, live, {"version": "x"}, {"paused": False})
    assert doc["host"]["cpus"] == [0, 1] and doc["host"]["cgroup"] == "hybrid"
    (d,) = doc["domains"]
    assert {k: d[k] for k in ("name", "uuid", "pid", "policy", "error")} == {
        "name": "vm1", "uuid": "uuid-vm1", "pid": 10, "policy": "gang", "error": None}
    assert d["vcpus"][0] | {} == {**d["vcpus"][0], "index": 0, "tid": 11, "frozen": True, "sched": "fifo",
                                  "costop_seconds": 1.5}
    assert d["vcpus"][1]["sched"] == "other" and d["vcpus"][1]["frozen"] is False      # the snapshot's
    assert doc["daemon"]["version"] == "x" and doc["daemon"]["engine"]["paused"] is False


def test_health_metrics():
    health = {"libvirt_connected": False, "samples": 7, "late_samples": 2, "sample_period": 0.25, "preset_errors": 1,
              "switcher_realtime": True, "healthy": True, "observation": "meter"}
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CoschedCollector(lambda: snap(dom()), dict, None, lambda: health))
    text = generate_latest(registry).decode()
    for line in ("cosched_libvirt_connected 0.0", "cosched_samples_total 7.0", "cosched_late_samples_total 2.0",
                 "cosched_sample_period_seconds 0.25", "cosched_preset_errors 1.0", "cosched_switcher_realtime 1.0",
                 "cosched_healthy 1.0", 'cosched_observation{source="meter"} 1.0'):
        assert line in text.splitlines()


def test_mode_and_watch_counts_in_status_and_metrics():
    from cosched.policy.plan import Cell, Member
    stats = Stats()
    stats.costops[("uuid-vm1", 0)], stats.boosts[("uuid-vm1", 1)] = 4, 7
    plan = Plan((Cell("relaxed-vm1", "relaxed", (), (Member("uuid-vm1", "vm1", 0, 0, ()),), kind="relaxed"),))
    auto = PolicySpec("auto", "auto", (), "annotation")
    s = snap(dom(), dom("vm2", policy=auto), dom("vm3"))
    doc = status.document(s, {}, plan, stats, {}, {}, {}, {"uuid-vm1": "relaxed", "uuid-vm2": "boost"})
    by = {d["name"]: d for d in doc["domains"]}
    assert (by["vm1"]["mode"], by["vm2"]["mode"], by["vm3"]["mode"]) == ("relaxed", "boost", None)
    assert (by["vm1"]["vcpus"][0]["costops"], by["vm1"]["vcpus"][1]["boosts"]) == (4, 7)

    class Engine:
        def __init__(self):
            self.plan = plan

        def stats(self):
            return stats
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CoschedCollector(lambda: s, dict, Engine(), None, lambda: {"uuid-vm1": "relaxed", "uuid-vm2": "boost"}))
    text = generate_latest(registry).decode()
    for line in ['cosched_domain_mode{domain="vm1",mode="relaxed"} 1.0', 'cosched_domain_mode{domain="vm2",mode="boost"} 1.0',
                 'cosched_vcpu_costops_total{domain="vm1",vcpu="0"} 4.0',
                 'cosched_vcpu_boosts_total{domain="vm1",vcpu="1"} 7.0']:
        assert line in text, line
    assert 'domain="vm3",mode' not in text
