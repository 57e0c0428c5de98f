"""The engine against a fake host tree, with the real switch loop in a thread
and a fake scheduling knob: nothing here reaches a real host thread."""
import time

import pytest

from tests.support.fakehost import FakeAffinity, FakeSched, ThreadSwitcher, reconcile

from cosched.actuators.journal import Journal
from cosched.actuators.sched import SchedAttr
from cosched.discovery import build_snapshot
from cosched.discovery.libvirt import DomainFacts
from cosched.engine import Engine
from cosched.policy.presets import Presets

GANG = """<domain><metadata><cosched:policy xmlns:cosched="urn:cosched:libvirt:1" name="gang" quantum-ms="200"/>
</metadata></domain>"""
UUIDS = ["11111111-0000-0000-0000-00000000000" + str(i) for i in range(3)]


def freeze_file(fake, i, v):
    return fake.root / f"sys/fs/cgroup/unified/machine/qemu-1-vm{i}.libvirt-qemu/vcpu{v}/cgroup.freeze"


def snapshot(fake, fs, n, xml=GANG):
    facts = []
    for i in range(n):
        fake.qemu(100 * (i + 1), f"vm{i}", UUIDS[i], {0: 100 * (i + 1) + 1, 1: 100 * (i + 1) + 2})
        for v in range(2):
            freeze_file(fake, i, v).write_text("0")
        facts.append(DomainFacts(f"vm{i}", UUIDS[i], xml))
    return build_snapshot(fs, facts, Presets.load([]), "none")


def engine_for(fs, journal, affinity, sched=None, **kw):
    knob = (sched or FakeSched()).knob(fs)
    return Engine(fs, journal, sched=knob, affinity=affinity.knob(fs), switcher_factory=ThreadSwitcher.factory(fs, knob),
                  **kw)


def test_reconcile_journals_pins_after_the_rotation_and_restores(fake, fs, tmp_path):
    journal = Journal(str(tmp_path / "run/journal"))
    affinity = FakeAffinity()
    sched = FakeSched()
    sched.attrs = {101: SchedAttr("batch", nice=4)}
    engine = engine_for(fs, journal, affinity, sched)
    try:
        plan = reconcile(engine, snapshot(fake, fs, 2))
        assert [m.name for m in plan.cells[0].members] == ["vm0", "vm1"]
        # originals journaled: freeze files, thread policies, pinning
        kinds = sorted({e["kind"] for e in journal.entries.values()})
        assert kinds == ["affinity", "freeze", "sched"]
        assert journal.entries["sched:101:1101"]["attr"] == SchedAttr("batch", nice=4).to_json()
        # the switcher confirmed the plan, then each vCPU got its own CPU
        assert sorted(affinity.calls) == [(101, (0,)), (102, (1,)), (201, (0,)), (202, (1,))]
        # the switcher runs the rotation: one guest's slot at a time (between
        # two slots both are frozen for a moment; on a loaded host the first
        # slot may already have passed)
        seen, end = set(), time.monotonic() + 5
        while time.monotonic() < end and not any(s.count("0") == 1 for s in seen):
            seen.add(tuple(freeze_file(fake, i, 0).read_text() for i in range(2)))
            time.sleep(0.001)
        assert ("0", "0") not in seen and any(s.count("0") == 1 for s in seen), seen
        # reconcile by difference: nothing new to pin
        affinity.calls.clear()
        reconcile(engine, snapshot(fake, fs, 2))
        assert affinity.calls == []
    finally:
        problems = engine.release()
    assert problems == []
    assert all(freeze_file(fake, i, v).read_text() == "0" for i in range(2) for v in range(2))
    assert all(c == (0, 1) for c in affinity.now.values())
    assert len(journal) == 0


def test_guest_leaving_management_is_unpinned_and_thawed(fake, fs, tmp_path):
    journal = Journal(str(tmp_path / "run/journal"))
    affinity = FakeAffinity()
    engine = engine_for(fs, journal, affinity)
    try:
        reconcile(engine, snapshot(fake, fs, 3))
        none = GANG.replace('name="gang"', 'name="none"')
        snap = snapshot(fake, fs, 3)
        facts = [DomainFacts(d.name, d.uuid, none if d.name == "vm2" else GANG) for d in snap.domains]
        from cosched.discovery import build_snapshot as rebuild
        reconcile(engine, rebuild(fs, facts, Presets.load([]), "none"))
        assert affinity.get(301) == (0, 1)
        assert freeze_file(fake, 2, 0).read_text() == "0"
        assert [m.name for m in engine.plan.cells[0].members] == ["vm0", "vm1"]
    finally:
        engine.release()


def test_dry_run_writes_nothing(fake, fs, tmp_path):
    journal = Journal(str(tmp_path / "run/journal"))
    affinity = FakeAffinity()
    engine = engine_for(fs, journal, affinity, dry_run=True)
    plan = reconcile(engine, snapshot(fake, fs, 2))
    assert plan.cells and affinity.calls == [] and len(journal) == 0
    assert engine.switcher.proc is None and sched_untouched(engine)


def sched_untouched(engine):
    return not engine.sched.get.__self__.calls


def test_a_boosted_rotation_returns_threads_to_their_recorded_attributes(fake, fs, tmp_path):
    boost = GANG.replace('quantum-ms="200"', 'quantum-ms="200" boost="true"')
    journal = Journal(str(tmp_path / "run/journal"))
    sched = FakeSched()
    originals = {101: SchedAttr("batch", nice=4), 102: SchedAttr("idle", nice=-2),
                 201: SchedAttr("other", nice=10), 202: SchedAttr("other")}
    sched.attrs = dict(originals)
    engine = engine_for(fs, journal, FakeAffinity(), sched)
    try:
        plan = reconcile(engine, snapshot(fake, fs, 2, xml=boost))
        assert plan.cells[0].members[0].priority > 0
        assert sched.attrs[101].policy == "fifo" and sched.attrs[201] == originals[201]
        assert engine.stats().realtime is True
    finally:
        assert engine.release() == []
    probes = {tid: attr for tid, attr in sched.attrs.items() if tid not in originals}
    assert sched.attrs == {**originals, **probes}
    # the admission check asked for no bandwidth on one thread of its own, and gave it its policy back
    assert list(probes.values()) == [SchedAttr()]
    assert len(journal) == 0


def test_a_thread_whose_original_could_not_be_read_is_never_boosted(fake, fs, tmp_path):
    boost = GANG.replace('quantum-ms="200"', 'quantum-ms="200" boost="true"')

    class Unreadable(FakeSched):
        def get(self, tid):
            if tid == 102:
                raise PermissionError(1, "Operation not permitted")
            return super().get(tid)
    sched = Unreadable()
    engine = engine_for(fs, Journal(str(tmp_path / "run/journal")), FakeAffinity(), sched)
    try:
        reconcile(engine, snapshot(fake, fs, 2, xml=boost))
        assert all(tid not in (101, 102) for tid, _ in sched.calls)       # vm0 unboosted: 102 unrecorded
    finally:
        engine.release()


def test_a_dead_switcher_is_undone_and_replaced_at_once(fake, fs, tmp_path):
    import threading
    import time
    asked = threading.Event()
    journal = Journal(str(tmp_path / "run/journal"))
    knob = FakeSched().knob(fs)
    affinity = FakeAffinity()
    engine = Engine(fs, journal, sched=knob, affinity=affinity.knob(fs), switcher_factory=ThreadSwitcher.factory(fs, knob),
                    resync=asked.set)
    try:
        snap = snapshot(fake, fs, 2)
        reconcile(engine, snap)
        assert [freeze_file(fake, i, 0).read_text() for i in range(2)] == ["0", "1"]
        time.sleep(1.0)                                   # one that dies at once is not restarted in a loop
        first = engine.switcher.proc
        first.switcher.release_all = lambda: None         # killed: it cleans nothing up itself
        first.kill()
        assert asked.wait(5), "the daemon was not asked to resync"
        assert all(freeze_file(fake, i, v).read_text() == "0" for i in range(2) for v in range(2))
        assert all(c == (0, 1) for c in affinity.now.values())      # no pinning without a rotation
        reconcile(engine, snap)                            # the resync it asked for
        assert engine.switcher.proc is not first and engine.switcher.proc.poll() is None
        assert sorted(freeze_file(fake, i, 0).read_text() for i in range(2)) == ["0", "1"]
    finally:
        assert engine.release() == []


def test_a_new_switcher_is_told_which_vcpus_the_daemon_returned_from_deadline_boosts(fake, fs, tmp_path):
    """A dead switcher's deadline boosts are restored through the zero
    reservation, which may leave those threads a deadline its period away:
    the next switcher's plan says until when not to boost them."""
    import threading
    asked = threading.Event()
    sched = FakeSched()
    knob = sched.knob(fs)
    engine = Engine(fs, Journal(str(tmp_path / "run/journal")), affinity=FakeAffinity().knob(fs), sched=knob,
                    switcher_factory=ThreadSwitcher.factory(fs, knob), resync=asked.set)
    try:
        snap = snapshot(fake, fs, 1, xml=GANG.replace('name="gang" quantum-ms="200"', 'name="boost"'))
        reconcile(engine, snap)
        assert engine.switcher.sent.cells[0].mode == "boost"
        assert [r.quiet_until for r in engine.switcher.sent.returns] == [0, 0]
        time.sleep(1.0)
        first = engine.switcher.proc
        first.switcher.release_all = lambda: None         # killed: it cleans nothing up itself
        sched.attrs[102] = SchedAttr("deadline", runtime_ns=2_000_000, deadline_ns=8_000_000, period_ns=8_000_000)
        first.kill()
        assert asked.wait(5), "the daemon was not asked to resync"
        assert sched.attrs[102] == SchedAttr()
        restored = time.monotonic_ns()
        reconcile(engine, snap)
        assert engine.switcher.proc is not first
        quiet = [r.quiet_until for r in engine.switcher.sent.returns]
        assert quiet[0] == 0 and restored - 2e9 < quiet[1] - knob._zero.period_ns <= restored, quiet
    finally:
        assert engine.release() == []


class SlowStart(ThreadSwitcher):
    """A switcher that takes a second to say it is ready (a loaded host)."""

    def _write(self, line):
        if not getattr(self, "_said", False):
            time.sleep(1.0)
            self._said = True
        super()._write(line)


def test_a_new_switcher_slow_to_start_is_not_taken_for_stalled(fake, fs, tmp_path):
    """The plan on record while a replacement starts is its dead
    predecessor's: the watchdog judges a switcher only once it is ready."""
    import threading
    asked = threading.Event()
    knob = FakeSched().knob(fs)
    made = []

    def factory(env):
        made.append((SlowStart if made else ThreadSwitcher)(fs, knob))
        return made[-1]
    engine = Engine(fs, Journal(str(tmp_path / "run/journal")), affinity=FakeAffinity().knob(fs), sched=knob,
                    switcher_factory=factory, resync=asked.set)
    try:
        snap = snapshot(fake, fs, 2)
        reconcile(engine, snap)
        time.sleep(1.0)
        made[0].switcher.release_all = lambda: None       # killed: it cleans nothing up itself
        made[0].kill()
        assert asked.wait(5), "the daemon was not asked to resync"
        started = time.monotonic()
        reconcile(engine, snap)
        assert len(made) == 2 and made[1].poll() is None and not getattr(made[1], "stalled", False)
        assert time.monotonic() - started < 5
        assert sorted(freeze_file(fake, i, 0).read_text() for i in range(2)) == ["0", "1"]
    finally:
        assert engine.release() == []


@pytest.mark.parametrize("exits", [True, False], ids=["exits-at-kill", "exits-later"])
def test_a_silent_switcher_is_killed_and_what_it_froze_is_thawed(fake, fs, tmp_path, exits):
    """A switcher that stops answering (stopped, starved, stuck in the kernel)
    with guests frozen: the engine's watchdog kills it, the vCPUs it left
    frozen are thawed and counted as forced thaws, and a new one is asked for
    at once, however short its life was. Killed, it runs no more of its code,
    but on a loaded host its exit, and so the end of its output, can come
    long after (once 0.6 s, past ``max_stall_ms``): the thaw does not wait
    for it."""
    import threading
    from cosched.engine.supervisor import stall_limit
    asked, killed, exited = threading.Event(), threading.Event(), threading.Event()
    journal = Journal(str(tmp_path / "run/journal"))
    knob = FakeSched().knob(fs)
    engine = Engine(fs, journal, affinity=FakeAffinity().knob(fs), sched=knob, switcher_factory=ThreadSwitcher.factory(fs, knob),
                    resync=asked.set, max_stall_ms=400)
    try:
        reconcile(engine, snapshot(fake, fs, 2))
        first = engine.switcher.proc                              # killed within its first second: replaced all the same
        first.switcher.release_all = lambda: None         # killed: it cleans nothing up itself
        first.switcher.tick = lambda: exited.wait()       # stuck: no slot changes, no reports
        kill = first.kill
        first.kill = (lambda: (killed.set(), exited.set(), kill())) if exits else killed.set
        time.sleep(0.1)                                   # a slot change under way when it stuck completes
        frozen = [(i, v) for i in range(2) for v in range(2) if freeze_file(fake, i, v).read_text() == "1"]
        assert len(frozen) == 2, frozen                   # one guest's two vCPUs
        assert asked.wait(stall_limit(400) + 5), "the stalled switcher was not replaced"
        assert killed.is_set(), "the stalled switcher was not killed"
        assert exits or first.poll() is None, "the test's switcher exited: nothing tested"
        assert all(freeze_file(fake, i, v).read_text() == "0" for i in range(2) for v in range(2))
        stats = engine.stats()
        assert stats.forced_thaws == 2 and any("silent" in e for e in stats.errors), stats
    finally:
        exited.set()                                      # exits-later: the stop at release ends it
        assert engine.release() == []


@pytest.mark.parametrize("runs_on_s", [0.1, 1.5], ids=["stops-soon", "runs-on"])
def test_a_silent_switcher_is_killed_a_stall_limit_after_it_last_ran_or_reported(fake, fs, tmp_path, runs_on_s):
    """The switcher's CPU time tells a silent switcher that still runs from
    one that stopped: a switcher that falls silent and stops running soon
    after is killed about a stall limit after its last report (what it ran
    between that report and the stop is no sign of life); one that goes on
    running while silent is spared until it stops, and killed soon after."""
    import threading
    from cosched.engine.supervisor import stall_limit
    asked, running, stuck = threading.Event(), threading.Event(), threading.Event()
    knob = FakeSched().knob(fs)
    engine = Engine(fs, Journal(str(tmp_path / "run/journal")), affinity=FakeAffinity().knob(fs), sched=knob,
                    switcher_factory=ThreadSwitcher.factory(fs, knob), resync=asked.set, max_stall_ms=2000)
    limit = stall_limit(2000)                         # 1 s
    try:
        reconcile(engine, snapshot(fake, fs, 2))
        first = engine.switcher.proc
        first.switcher.release_all = lambda: None     # killed: it cleans nothing up itself
        schedstat = fake.root / f"proc/{first.pid}/schedstat"
        schedstat.parent.mkdir(parents=True)
        schedstat.write_text("0 0 0\n")

        def run():                                    # its CPU time goes up while it runs
            ns = 0
            while running.is_set():
                ns += 1000
                (schedstat.parent / "new").write_text(f"{ns} 0 0\n")
                (schedstat.parent / "new").replace(schedstat)    # whole, as /proc reads are
                time.sleep(0.01)
        running.set()
        threading.Thread(target=run, daemon=True).start()
        time.sleep(0.3)
        first.switcher.tick = lambda: stuck.wait()    # silent from its next wake-up on
        silent = time.monotonic()
        time.sleep(runs_on_s)
        assert not asked.is_set(), "killed while it ran"
        running.clear()                               # and now it stops running
        stopped = time.monotonic()
        assert asked.wait(limit + 2), "the stopped switcher was not replaced"
        killed = time.monotonic()
        if runs_on_s < limit:
            assert limit - 0.2 < killed - silent < 1.5 * limit, killed - silent
        else:
            assert killed - stopped < 0.5 * limit, killed - stopped
    finally:
        running.clear()
        stuck.set()
        assert engine.release() == []


def test_a_healthy_switcher_is_never_judged(fake, fs, tmp_path, monkeypatch):
    """The reader that takes a busy switcher's reports is also its watchdog:
    while reports come on time it wakes only to read them."""
    import select as real
    from cosched.engine import supervisor
    silences = []

    class Counting:
        def select(self, r, w, x, timeout):
            ready = real.select(r, w, x, timeout)
            if not ready[0]:
                silences.append(timeout)
            return ready
    monkeypatch.setattr(supervisor, "select", Counting())
    knob = FakeSched().knob(fs)
    engine = Engine(fs, Journal(str(tmp_path / "run/journal")), affinity=FakeAffinity().knob(fs), sched=knob,
                    switcher_factory=ThreadSwitcher.factory(fs, knob), max_stall_ms=400)
    try:
        reconcile(engine, snapshot(fake, fs, 2))
        time.sleep(1.5)
        assert silences == [] and engine.stats().forced_thaws == 0, (silences, engine.stats().errors)
    finally:
        assert engine.release() == []


def test_a_switcher_given_work_after_a_quiet_spell_is_not_taken_for_stalled(fake, fs, tmp_path):
    """An idle switcher reports once a second; the plan that gives it cells
    restarts the watchdog's clock, so its first slot is not a stall."""
    journal = Journal(str(tmp_path / "run/journal"))
    knob = FakeSched().knob(fs)
    engine = Engine(fs, journal, affinity=FakeAffinity().knob(fs), sched=knob, switcher_factory=ThreadSwitcher.factory(fs, knob),
                    max_stall_ms=400)
    try:
        snap = snapshot(fake, fs, 2, xml="<domain/>")      # no policy: nothing to switch
        reconcile(engine, snap)
        first = engine.switcher.proc
        assert first is not None and first.poll() is None
        for _ in range(3):                                 # quiet spells ending at different points of a second
            time.sleep(0.85)
            reconcile(engine, snapshot(fake, fs, 2))
            time.sleep(0.3)
            reconcile(engine, snap)
        assert engine.switcher.proc is first and engine.stats().forced_thaws == 0, engine.stats().errors
    finally:
        assert engine.release() == []
