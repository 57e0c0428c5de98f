"""Kernel errors injected into every actuator: handled, reported, nothing stranded.

Each knob in turn (cgroup freezer, RT runtime, scheduling attributes, thread
affinity: pinning) fails every write with EBUSY, ENOENT, EPERM or EINVAL, or takes the
write without effect (``ignored``: the call succeeds, the host keeps its old
value), for the whole life of a daemon managing a boosted gang rotation: the
engine with the real switch loop (in a thread), a fake host tree, a fake
scheduling knob and fake thread affinities. Then:

* nothing raises, and the rotation goes on with what still works;
* every refusal other than "gone" is reported, naming the guest or the file
  and the error;
* what could not be restored when the daemon stopped stays in the journal,
  and once the fault is gone ``cosched reset`` (a journal restore) puts the
  host back exactly as it was: nothing stranded.
"""
from __future__ import annotations

import errno
import logging
import os
import time

import pytest
from tests.support.fakehost import CgroupEventsFS, FakeAffinity, FakeSched, ThreadSwitcher, reconcile
from tests.support.soak import record
from tests.unit.engine.test_engine import GANG, freeze_file, snapshot
from tests.unit.switcher.test_switcher import CPU, Clock, gang, member, tree

from cosched.actuators import journal as jr
from cosched.actuators.journal import Journal
from cosched.actuators.sched import SchedAttr
from cosched.engine import Engine
from cosched.switcher.switcher import Switcher
FAULTS = {"EBUSY": errno.EBUSY, "ENOENT": errno.ENOENT, "EPERM": errno.EPERM, "EINVAL": errno.EINVAL,
          "ignored": None}
KNOBS = ("freeze", "rt", "sched", "affinity")
BOOSTED_GANG = GANG.replace('quantum-ms="200"', 'quantum-ms="100" boost="true"')
RT_ROOT = "950000"


class Fault:
    """One knob failing in one way, until :meth:`clear`."""

    def __init__(self, knob: str, how: str):
        self.knob, self.how, self.active, self.hits = knob, how, True, 0

    def hit(self, knob: str) -> bool:
        """For a write through ``knob``: raise the injected error, or say
        whether to drop the write (``ignored``)."""
        if not self.active or knob != self.knob:
            return False
        self.hits += 1
        if FAULTS[self.how] is not None:
            raise OSError(FAULTS[self.how], os.strerror(FAULTS[self.how]))
        return True

    def clear(self) -> None:
        self.active = False


class FaultFS(CgroupEventsFS):
    """A fake cgroup tree (``cgroup.events`` follows ``cgroup.freeze``) with
    the fault applied to freezer and RT runtime writes."""

    def __init__(self, root, fault: Fault):
        super().__init__(root)
        self.fault = fault

    def write(self, host_path, data):
        knob = "freeze" if host_path.endswith("/cgroup.freeze") else \
            "rt" if host_path.endswith("/cpu.rt_runtime_us") else None
        if not (knob and self.fault.hit(knob)):
            super().write(host_path, data)


class FaultSched(FakeSched):
    def __init__(self, fault: Fault):
        super().__init__()
        self.fault = fault

    def set(self, tid, attr):
        if not self.fault.hit("sched"):
            super().set(tid, attr)


class FaultAffinity(FakeAffinity):
    def __init__(self, fault: Fault):
        super().__init__()
        self.fault = fault

    def set(self, tid, cpus):
        if not self.fault.hit("affinity"):
            super().set(tid, cpus)


def rt_host(fake):
    """RT group scheduling: ``cpu.rt_runtime_us`` along every vCPU's cpu cgroup path."""
    fake.write("/sys/fs/cgroup/cpu/cpu.rt_runtime_us", RT_ROOT)
    fake.write("/sys/fs/cgroup/cpu/machine/cpu.rt_runtime_us", "0")
    for i in range(2):
        scope = f"/sys/fs/cgroup/cpu/machine/qemu-1-vm{i}.libvirt-qemu"
        for path in (scope, f"{scope}/vcpu0", f"{scope}/vcpu1"):
            fake.write(f"{path}/cpu.rt_runtime_us", "0")


def host_state(fake, sched, affinity):
    """Everything the knobs touch: freeze files, RT runtime files, thread attributes and affinities."""
    root = fake.root
    files = sorted(p for p in root.rglob("*") if p.name in ("cgroup.freeze", "cpu.rt_runtime_us"))
    return ({str(p.relative_to(root)): p.read_text().strip() for p in files},
            {tid: sched.get(tid) for tid in (101, 102, 201, 202)},
            {tid: affinity.get(tid) for tid in (101, 102, 201, 202)})


@pytest.mark.parametrize("how", FAULTS)
@pytest.mark.parametrize("knob", KNOBS)
def test_a_failing_knob_is_reported_and_strands_nothing(knob, how, fake, tmp_path, caplog):
    fault = Fault(knob, how)
    fs = FaultFS(fake.root, fault)
    sched, affinity = FaultSched(fault), FaultAffinity(fault)
    sched.attrs = {101: SchedAttr("batch", nice=4), 202: SchedAttr("idle")}
    journal = Journal(str(tmp_path / "run/journal"))
    knob_ = sched.knob(fs)
    engine = Engine(fs, journal, sched=knob_, affinity=affinity.knob(fs),
                    switcher_factory=ThreadSwitcher.factory(fs, knob_))
    snap = snapshot(fake, fs, 2, xml=BOOSTED_GANG)
    rt_host(fake)
    snap = snapshot(fake, fs, 2, xml=BOOSTED_GANG)        # discovery again, now seeing the RT files
    before = host_state(fake, sched, affinity)
    caplog.set_level(logging.INFO)
    try:
        plan = reconcile(engine, snap)
        assert [m.name for m in plan.cells[0].members] == ["vm0", "vm1"]
        reconcile(engine, snap)
        seen = set()                                     # which guests were seen running alone
        deadline = time.monotonic() + (0.3 if knob == "freeze" else 2.0)
        while time.monotonic() < deadline and len(seen) < 2:
            thawed = [i for i in range(2) if freeze_file(fake, i, 0).read_text() == "0"]
            seen.update(thawed if len(thawed) == 1 else [])
            time.sleep(0.01)
        assert engine.switcher.proc.poll() is None, "the switch loop stopped"
        if knob != "freeze":                             # the rotation goes on with what works
            assert seen == {0, 1}, "no rotation"
    finally:
        problems = engine.release()
    assert fault.hits > 0, f"the {knob} knob was never used: nothing was tested"
    said = "\n".join([r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] + problems
                     + list(engine.stats().errors))
    if how == "ENOENT":
        pass                                             # "gone": nothing to report, nothing to restore
    elif how == "ignored":
        # the kernel said yes: a freeze that never lands, or a grant that does not hold, is
        # noticed at once; a pin or an attribute that did not change needs no undoing
        if knob == "freeze":
            assert "not frozen within 50 ms" in said and "vm" in said, said
    else:
        reason = os.strerror(FAULTS[how])
        assert reason in said, f"{knob} {how}: not reported:\n{said}"
        culprits = [line for line in said.splitlines() if reason in line]
        # each names its guest, or the file (a machine-wide RT runtime file is no one guest's)
        assert all(any(name in line for name in ("vm0", "vm1", "/machine/cpu.rt_runtime_us")) for line in culprits), \
            culprits
    fault.clear()
    undone = jr.restore(journal, engine.knobs)           # cosched reset, the fault gone
    after = host_state(fake, sched, affinity)
    record("kernel errors injected into each actuator (fake host)", cycles=1, faults=fault.hits,
           leaks=len(undone) + len(journal) + int(after != before))
    assert undone == [] and len(journal) == 0
    assert after == before


@pytest.mark.parametrize("how", ["EBUSY", "EPERM", "EINVAL", "ignored"])
def test_a_refused_rt_grant_leaves_the_cell_freeze_only_and_says_so(how, tmp_path):
    fault = Fault("rt", how)
    fs = tree(tmp_path, rt=True)
    fs.write = lambda path, data, real=fs.write: None if (path.endswith("cpu.rt_runtime_us") and fault.hit("rt")) \
        else real(path, data)
    sched = FakeSched()
    sw = Switcher(fs, 500_000_000, rt_top_us=900_000, sched=sched.knob(fs), clock=Clock())
    sw.apply(gang(member("a", prio=1, rt=True, rt_us=100_000), member("b", prio=1, rt=True, rt_us=100_000),
                  rt_top_us=900_000))
    stats = sw.take_stats()
    assert "freeze-only" in stats.boost_failed.get("gang", ""), stats
    assert sched.calls == []                             # no FIFO boost without its runtime
    fault.clear()
    sw.release_all()
    assert {fs.read(f"{CPU}/machine/{p}cpu.rt_runtime_us") for p in ("", "a/", "a/vcpu0/", "b/vcpu1/")} == {"0"}
