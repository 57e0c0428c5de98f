"""The switch loop against fake cgroup trees and a fake scheduling knob."""
import errno
import os
import threading
import time
from dataclasses import replace

import pytest

from tests.support.fakehost import CgroupEventsFS as FreezerFS, FakeSched

from cosched.actuators.sched import SchedAttr, zero_bandwidth
from cosched.policy.plan import Cell, Member, PlannedVcpu
from cosched.switcher import protocol as pr
from cosched.switcher.loop import serve
from cosched.switcher.switcher import Switcher
from cosched.switcher.timing import WATCH_POLL_NS as POLL
CG2 = "/sys/fs/cgroup/unified"
CPU = "/sys/fs/cgroup/cpu"
MS = 1_000_000


class Clock:
    def __init__(self):
        self.now = 0

    def __call__(self):
        return self.now


def tree(tmp_path, names=("a", "b", "c"), rt=False):
    fs = FreezerFS(tmp_path)
    for n in names:
        for i in range(2):
            (tmp_path / f"sys/fs/cgroup/unified/machine/{n}/vcpu{i}").mkdir(parents=True)
            (tmp_path / f"sys/fs/cgroup/cpu/machine/{n}/vcpu{i}").mkdir(parents=True)
    for n in names:
        for i in range(2):
            fs.write(f"{CG2}/machine/{n}/vcpu{i}/cgroup.freeze", "0")
            if rt:
                fs.write(f"{CPU}/machine/{n}/vcpu{i}/cpu.rt_runtime_us", "0")
        if rt:
            fs.write(f"{CPU}/machine/{n}/cpu.rt_runtime_us", "0")
    if rt:
        fs.write(f"{CPU}/machine/cpu.rt_runtime_us", "0")
    # the zero reservation's period, which a vCPU returned from a late boost waits: half a poll
    (tmp_path / "proc/sys/kernel").mkdir(parents=True, exist_ok=True)
    fs.write("/proc/sys/kernel/sched_deadline_period_max_us", "250")
    return fs


def member(n, slot=50, prio=0, rt=False, rt_us=None):
    tid = {"a": 100, "b": 200, "c": 300, "d": 400}[n]
    chain = lambda i: (f"{CPU}/machine/cpu.rt_runtime_us", f"{CPU}/machine/{n}/cpu.rt_runtime_us",
                       f"{CPU}/machine/{n}/vcpu{i}/cpu.rt_runtime_us") if rt else ()
    return Member(n, n, slot, prio, tuple(
        PlannedVcpu(i, tid + i, 0, -1, f"{CG2}/machine/{n}/vcpu{i}/cgroup.freeze", chain(i)) for i in range(2)), rt_us)


def back(m, original=SchedAttr(), quiet=None):
    """The returns of a member's vCPUs: to ``original``, not deadline-boosted before ``quiet[index]``."""
    return tuple(pr.VcpuReturn(v.tid, original, (quiet or {}).get(v.index, 0)) for v in m.vcpus)


def gang(*members, mode="freeze", max_stall_ms=500, rt_top_us=None, returns=()):
    return pr.Orders(1, max_stall_ms, rt_top_us, (Cell("gang", mode, (), members),), returns=returns)


def thawed(fs, names):
    return [n for n in names if fs.read(f"{CG2}/machine/{n}/vcpu0/cgroup.freeze") == "0"]


def test_rotation_one_guest_thawed_at_a_time(tmp_path):
    fs, clock = tree(tmp_path), Clock()
    sw = Switcher(fs, 500 * MS, clock=clock)
    sw.apply(gang(member("a"), member("b"), member("c")))
    seen = []
    for step in range(9):
        assert thawed(fs, "abc") == [seen_name := "abc"[step % 3]]
        seen.append(seen_name)
        clock.now += 50 * MS
        assert sw.tick() == clock.now + 50 * MS
    assert seen == list("abcabcabc")
    stats = sw.take_stats()
    assert stats.switches == {"gang": 9}
    assert len(stats.latency_ns) == 9 and stats.forced_thaws == 0
    # each guest was frozen 100 ms per 150 ms cycle
    assert stats.costop[("a", 0)] == pytest.approx(0.3)                 # thawed again at 150, 300 and 450 ms


def test_hosted_guests_share_one_turn_and_a_new_plan_keeps_it_running(tmp_path):
    fs, clock = tree(tmp_path), Clock()
    sw = Switcher(fs, 500 * MS, clock=clock)
    hosted = [replace(member(n, slot=100), hosted=True) for n in "bc"]
    sw.apply(gang(member("a"), *hosted))
    assert thawed(fs, "abc") == ["a"]
    clock.now += 50 * MS
    assert sw.tick() == clock.now + 100 * MS                 # the shared turn's length
    assert thawed(fs, "abc") == ["b", "c"]
    sw.apply(gang(member("a"), hosted[1]))                  # b left: c's turn goes on, to the same deadline
    assert thawed(fs, "ac") == ["c"] and thawed(fs, "b") == ["b"]     # b let go of, thawed
    assert sw.tick() == 150 * MS
    clock.now = 150 * MS
    sw.tick()
    assert thawed(fs, "ac") == ["a"] and sw.take_stats().active == {"gang": "a"}


def test_freeze_completes_before_thaw(tmp_path):
    fs, clock = tree(tmp_path), Clock()
    sw = Switcher(fs, 500 * MS, clock=clock)
    sw.apply(gang(member("a"), member("b")))
    fs.writes.clear()
    clock.now += 50 * MS
    sw.tick()
    order = [(p.split("/")[-3], d) for p, d in fs.writes if p.endswith("cgroup.freeze")]
    assert order == [("a", "1"), ("a", "1"), ("b", "0"), ("b", "0")]


def test_release_thaws_and_returns_each_boost_to_its_recorded_attributes(tmp_path):
    fs, clock, sched = tree(tmp_path), Clock(), FakeSched()
    batch = SchedAttr("batch", nice=5)
    deadline = SchedAttr("deadline", runtime_ns=1 * MS, deadline_ns=10 * MS, period_ns=10 * MS)
    sw = Switcher(fs, 500 * MS, sched=sched.knob(fs, clock), clock=clock)
    sw.apply(gang(member("a", prio=1), member("b", prio=1), member("c", prio=1),
                  returns=back(member("a"), batch) + back(member("b"), deadline)))
    assert sched.attrs[100] == SchedAttr("fifo", priority=1) and 200 not in sched.attrs
    clock.now += 50 * MS
    sw.tick()
    assert sched.attrs[100] == batch and sched.attrs[200] == SchedAttr("fifo", priority=1)
    sw.release_all()
    assert thawed(fs, "abc") == list("abc")
    assert sched.attrs == {100: batch, 101: batch, 200: deadline, 201: deadline}


def test_removed_guest_is_released_mid_rotation(tmp_path):
    fs, clock = tree(tmp_path), Clock()
    sw = Switcher(fs, 500 * MS, clock=clock)
    sw.apply(gang(member("a"), member("b"), member("c")))
    assert thawed(fs, "abc") == ["a"]
    sw.apply(gang(member("a"), member("b")))          # c stopped being managed while frozen
    assert thawed(fs, "abc") == ["a", "c"]


def test_vanished_vcpu_is_harmless(tmp_path):
    fs, clock = tree(tmp_path), Clock()
    sw = Switcher(fs, 500 * MS, clock=clock)
    sw.apply(gang(member("a"), member("b")))
    import shutil
    shutil.rmtree(tmp_path / "sys/fs/cgroup/unified/machine/b")       # domain destroyed mid-slot
    clock.now += 50 * MS
    sw.tick()
    clock.now += 50 * MS
    sw.tick()
    assert thawed(fs, "a") == ["a"]
    assert not sw.take_stats().errors                    # ENOENT is normal life


def test_force_thaw_after_max_stall(tmp_path):
    fs, clock = tree(tmp_path), Clock()
    sw = Switcher(fs, 120 * MS, clock=clock)
    sw.apply(gang(member("a", slot=100), member("b", slot=100), max_stall_ms=120))
    clock.now += 99 * MS
    sw.tick()
    assert thawed(fs, "ab") == ["a"]
    # the loop was held up far past a slot: b must not stay frozen
    clock.now += 400 * MS
    sw.tick()
    assert "b" in thawed(fs, "ab")


def test_a_vcpu_that_does_not_freeze_is_named_and_the_rotation_goes_on(tmp_path):
    fs, clock = tree(tmp_path), Clock()
    fs.stuck.add(f"{CG2}/machine/b/vcpu1")           # never traps (queued for a CPU, or blocked in the kernel)
    sw = Switcher(fs, 120 * MS, clock=clock)
    sw.apply(gang(member("a"), member("b"), max_stall_ms=120))
    assert thawed(fs, "ab") == ["a"]                 # b keeps its freeze request: it traps once it runs
    stats = sw.take_stats()
    assert stats.errors == ["domain=b vcpu=1 not frozen within 30 ms: it freezes when it next runs"]
    assert stats.forced_thaws == 0
    for turn in "bab":
        clock.now += 50 * MS
        sw.tick()
        assert thawed(fs, "ab") == [turn]
    assert sw.take_stats().forced_thaws == 0         # its own slot thaws it, as any other


def test_eperm_boost_falls_back_to_freeze_only(tmp_path):
    fs, clock = tree(tmp_path), Clock()
    sw = Switcher(fs, 500 * MS, sched=FakeSched(fail={"fifo": errno.EPERM}).knob(fs, clock), clock=clock)
    sw.apply(gang(member("a", prio=1), member("b", prio=1)))
    stats = sw.take_stats()
    assert stats.boost_failed["gang"].startswith("boost impossible for domain a")
    assert any("freeze-only" in e for e in stats.errors)
    clock.now += 50 * MS
    sw.tick()
    assert thawed(fs, "ab") == ["b"]                     # rotation goes on


def test_ebusy_freeze_write_is_reported_not_fatal(tmp_path, monkeypatch):
    fs, clock = tree(tmp_path), Clock()
    sw = Switcher(fs, 500 * MS, clock=clock)
    real = fs.write

    def busy(path, data):
        if path.endswith("machine/b/vcpu0/cgroup.freeze"):
            raise OSError(errno.EBUSY, "busy")
        real(path, data)
    monkeypatch.setattr(fs, "write", busy)
    sw.apply(gang(member("a"), member("b")))
    assert any("domain=b vcpu=0" in e and "busy" in e for e in sw.take_stats().errors)


def test_rt_runtime_granted_statically_and_restored(tmp_path):
    fs, clock = tree(tmp_path, rt=True), Clock()
    sw = Switcher(fs, 500 * MS, rt_top_us=900_000, sched=FakeSched().knob(fs, clock), clock=clock)
    sw.apply(gang(member("a", prio=1, rt=True, rt_us=100_000), member("b", prio=1, rt=True, rt_us=100_000),
                  rt_top_us=900_000))
    rt = lambda p: fs.read(f"{CPU}/machine/{p}cpu.rt_runtime_us")
    assert rt("") == "900000" and rt("a/") == "200000" and rt("b/vcpu1/") == "100000"
    clock.now += 50 * MS
    sw.tick()
    assert rt("a/vcpu0/") == "100000"                    # kept between slots: no throttle debt
    sw.release_all()
    assert {rt(p) for p in ("", "a/", "a/vcpu0/", "b/vcpu1/")} == {"0"}


def test_protocol_names_a_bad_message():
    import pytest
    with pytest.raises(ValueError, match="bad message"):
        pr.decode('{"type": "orders", "seq": 1}')
    with pytest.raises(ValueError, match="bad message"):
        pr.decode('{"type": "launch"}')


# -- watched guests: boost (BCS) and relaxed ------------------------------
class Procs:
    """/proc/TID/stat, schedstat and status of fake vCPU threads, rewritten between polls.
    Each starts queued: runnable, switched in as often as out."""

    def __init__(self, fs, tids):
        self.fs = fs
        self.state = {tid: ["R", 0, 0, 1, 1] for tid in tids}     # state, cpu, run ns, switch-ins, switch-outs
        for tid in tids:
            fs.path(f"/proc/{tid}").mkdir(parents=True)
            self.write(tid)

    def write(self, tid):
        state, cpu, run, picks, outs = self.state[tid]
        rest = [state] + ["0"] * 18 + [str(1000 + tid)] + ["0"] * 16 + [str(cpu), "0", "0"] + ["0"] * 11
        self.fs.write(f"/proc/{tid}/stat", f"{tid} (CPU 0/TCG) " + " ".join(rest) + "\n")
        self.fs.write(f"/proc/{tid}/schedstat", f"{run} 0 {picks}\n")
        self.fs.write(f"/proc/{tid}/status", f"Name:\tCPU 0/TCG\nState:\t{state}\nvoluntary_ctxt_switches:\t{outs - 1}\n"
                                             f"nonvoluntary_ctxt_switches:\t1\n")

    def picked(self, tid):
        """Switched in (from the queue)."""
        self.state[tid][3] += 1
        self.write(tid)

    def runs(self, tid, ns=MS):
        """On a CPU (switched in first if it was not), its run time brought up to date by a tick."""
        if self.state[tid][3] == self.state[tid][4]:
            self.state[tid][3] += 1
        self.state[tid][2] += ns
        self.write(tid)

    def preempted(self, tid, ns=MS):
        """Switched out, still runnable: queued."""
        self.state[tid][2] += ns
        self.state[tid][4] = self.state[tid][3]
        self.write(tid)


def watched(mode, *members, max_boosted=2, returns=()):
    return pr.Orders(1, 500, None, tuple(Cell(f"{mode}-{m.name}", mode, (), (m,)) for m in members),
                   max_boosted=max_boosted, returns=returns)


def test_bcs_boosts_with_sched_deadline_and_returns_to_the_recorded_attributes(tmp_path):
    from cosched.switcher.boosts import boost_attr
    fs, clock, sched = tree(tmp_path), Clock(), FakeSched()
    procs = Procs(fs, (100, 101))
    batch = SchedAttr("batch", nice=3)
    sw = Switcher(fs, 500 * MS, sched=sched.knob(fs, clock), clock=clock)
    a = replace(member("a"), boost_ms=2)
    sw.apply(watched("boost", a, returns=back(a, batch)))
    assert sw.tick() == POLL and sched.calls == []     # the first poll is due at once, and only looks
    for _ in range(2):
        clock.now += POLL
        procs.runs(100)                                # vCPU 0 runs, vCPU 1 stays queued
        sw.tick()
    assert sched.attrs[101] == boost_attr(2) and boost_attr(2).policy == "deadline"
    clock.now += POLL
    procs.picked(101)                                  # it got a CPU: back to exactly what it had
    sw.tick()
    assert sched.attrs[101] == batch
    assert sched.calls[-2:] == [(101, zero_bandwidth(fs)), (101, batch)]   # young: through the zero reservation
    assert sw.take_stats().boosts[("a", 1)] == 1
    assert all(fs.read(f"{CG2}/machine/a/vcpu{i}/cgroup.freeze") == "0" for i in range(2))   # nothing left frozen


def test_a_return_through_the_zero_reservation_holds_the_vcpu_still_and_a_straight_one_does_not(tmp_path):
    """Between the two calls of a return through the zero reservation the
    vCPU is frozen (a thread that woke there ran at that reservation's
    rate), and thawed right after; a vCPU the knob returns straight is not
    frozen at all."""
    fs, clock, sched = tree(tmp_path), Clock(), FakeSched()
    procs = Procs(fs, (100, 101))
    freeze = f"{CG2}/machine/a/vcpu1/cgroup.freeze"
    during = []
    put = sched.set
    sched.set = lambda tid, attr: (tid == 101 and during.append((attr.policy, fs.read(freeze))), put(tid, attr))[1]
    sw = Switcher(fs, 500 * MS, sched=sched.knob(fs, clock, offset=lambda: 0), clock=clock)
    sw.apply(watched("boost", replace(member("a"), boost_ms=2)))
    sw.tick()

    def boost_and_return(budget, ahead, asleep):
        during.clear()
        fs.write("/proc/101/sched", f"dl.runtime : 4000000\ndl.deadline : {clock.now + 8 * MS}\n")   # a new period
        while not during:                              # 101 waits behind the running 100 until boosted
            clock.now += POLL
            procs.runs(100)
            sw.tick()
        fs.write("/proc/101/sched", f"dl.runtime : {budget}\ndl.deadline : {clock.now + ahead}\n")
        clock.now += POLL
        if asleep:
            procs.state[101][0] = "S"                   # it blocked: its boost ends
            procs.write(101)
        else:
            procs.picked(101)                          # it got a CPU: its boost ends
        sw.tick()
        procs.state[101][0] = "R"
        procs.write(101)
        clock.now += 20 * MS                           # its next boost may come
        return during[1:]

    assert boost_and_return(3_000_000, 6_000_000, asleep=True) == [("deadline", "1"), ("other", "1")]
    assert fs.read(freeze) == "0"
    assert boost_and_return(-50_000, 2_000_000, asleep=False) == [("other", "0")]
    assert fs.read(freeze) == "0"


def test_a_boost_that_finds_no_budget_is_taken_back_at_once(tmp_path):
    """A vCPU whose boost found a budget left from an earlier reservation,
    at or below 0, would not run at all while boosted: it is returned at
    once (straight: its budget ran out) and counted as ``stale``, and not
    boosted with SCHED_DEADLINE again before the knob allows; its waits
    take SCHED_FIFO boosts meanwhile."""
    from cosched.actuators.sched import LEAVE_MARGIN_NS
    fs, clock, sched = tree(tmp_path), Clock(), FakeSched()
    procs = Procs(fs, (100, 101))
    fs.write("/proc/101/sched", f"dl.runtime : -65955\ndl.deadline : {clock.now + 30 * MS}\n")
    sw = Switcher(fs, 500 * MS, sched=sched.knob(fs, clock, offset=lambda: 0), clock=clock)
    sw.apply(watched("boost", replace(member("a"), boost_ms=2)))
    sw.tick()
    for _ in range(2):
        clock.now += POLL
        procs.runs(100)
        sw.tick()
    calls = lambda: [attr.policy for tid, attr in sched.calls if tid == 101]
    assert calls()[:2] == ["deadline", "other"]
    assert sw.take_stats().long_waits_held["stale"] == 1
    hold = 30 * MS + 2 * 65955 + LEAVE_MARGIN_NS
    while clock.now < hold - POLL:
        clock.now += POLL
        procs.runs(100)
        sw.tick()
        assert "deadline" not in calls()[2:], clock.now
    assert "fifo" in calls()[2:]
    fs.write("/proc/101/sched", f"dl.runtime : 4000000\ndl.deadline : {clock.now + 8 * MS}\n")   # as the kernel shows it
    made = len(calls())
    for _ in range(8):                   # its SCHED_FIFO boost over (boost-ms), the next is a deadline one
        clock.now += POLL
        procs.runs(100)
        sw.tick()
    assert "deadline" in calls()[made:]


def test_a_vcpu_returned_from_a_late_boost_is_not_boosted_for_the_zero_reservations_period(tmp_path):
    """A switcher held up past a boost's deadline returns the vCPU through
    the zero reservation all the same (nothing left counted), which may
    give it a deadline that far away: that vCPU is not boosted again before
    the zero reservation's period is over. Nor is one the daemon restored
    lately (``VcpuReturn.quiet_until``), whatever the new switcher knows."""
    from cosched.switcher.boosts import boost_attr
    fs, clock, sched = tree(tmp_path), Clock(), FakeSched()
    fs.write("/proc/sys/kernel/sched_deadline_period_max_us", "100000")     # 100 ms
    zero = zero_bandwidth(fs)
    procs = Procs(fs, (100, 101))
    sw = Switcher(fs, 500 * MS, sched=sched.knob(fs, clock), clock=clock)
    a = replace(member("a"), boost_ms=2)
    restored = clock.now + 100 * MS
    sw.apply(watched("boost", a, returns=back(a, quiet={1: restored})))

    def step():
        clock.now += POLL
        procs.runs(100)                                # 101 waits behind the running 100
        sw.tick()
    sw.tick()
    policies = lambda: [attr.policy for tid, attr in sched.calls if tid == 101]
    while clock.now < restored - POLL:
        step()
        assert "deadline" not in policies(), clock.now    # restored by the daemon: its deadline boosts wait
    assert "fifo" in policies()                            # SCHED_FIFO ones meanwhile
    step()
    step()
    assert sched.attrs[101].policy == "deadline"
    clock.now += boost_attr(2, sw.watching.share).deadline_ns   # held up: boost-ms and the deadline are over
    procs.runs(100)
    sw.tick()
    assert (101, zero) in sched.calls[-4:] and sched.calls[-1] == (101, SchedAttr())
    returned, made = clock.now, len(sched.calls)
    while clock.now < returned + 100 * MS - POLL:
        step()
        assert "deadline" not in [a.policy for t, a in sched.calls[made:] if t == 101], clock.now - returned
    step()
    step()
    assert sched.attrs[101].policy == "deadline"


def test_long_waits_left_for_want_of_room_are_counted(tmp_path):
    """Two guests each co-starting a sibling stacked on its runner's CPU need
    two boosts each; with room for two, one guest's long wait waits on."""
    fs, clock, sched = tree(tmp_path), Clock(), FakeSched()
    procs = Procs(fs, (100, 101, 200, 201))
    sw = Switcher(fs, 500 * MS, sched=sched.knob(fs, clock), clock=clock)
    sw.apply(watched("boost", replace(member("a"), boost_ms=2), replace(member("b"), boost_ms=2), max_boosted=2))
    sw.tick()
    for _ in range(2):
        clock.now += POLL
        procs.runs(100)
        procs.runs(200)                                # vCPU 0 of each runs, vCPU 1 stays queued on its CPU
        sw.tick()
    boosted = {tid for tid, attr in sched.attrs.items() if attr.policy == "deadline"}
    assert boosted in ({100, 101}, {200, 201}), sched.attrs
    assert sw.take_stats().long_waits_held == {"room": 1}


def test_bcs_sees_a_vcpu_running_between_ticks_as_running(tmp_path):
    """Run time grows only at a tick or switch-out: a vCPU on its CPU for a
    while shows no change, as a queued one; the switch counts tell them apart."""
    from cosched.switcher.boosts import boost_attr
    fs, clock, sched = tree(tmp_path), Clock(), FakeSched()
    procs = Procs(fs, (100, 101))
    sw = Switcher(fs, 500 * MS, sched=sched.knob(fs, clock), clock=clock)
    sw.apply(watched("boost", replace(member("a"), boost_ms=2)))
    procs.runs(100)
    procs.runs(101)                                    # both on a CPU
    sw.tick()
    for _ in range(3):                                 # no tick, no switch: nothing changes
        clock.now += POLL
        sw.tick()
    assert sched.calls == []
    clock.now += POLL
    procs.preempted(101)                               # vCPU 1 loses its CPU; vCPU 0 runs on, unchanged
    sw.tick()
    assert sched.calls == []                           # a wait seen once may be over by the next poll
    clock.now += POLL
    sw.tick()
    assert sched.attrs[101] == boost_attr(2)           # seen at two polls: a long wait


def test_a_calm_boost_guest_is_polled_less_often_and_an_idle_relaxed_one_every_third_poll(tmp_path):
    from cosched.policy.watch import SLOWEST
    fs, clock, sched = tree(tmp_path), Clock(), FakeSched()
    procs = Procs(fs, (100, 101, 200, 201))
    for tid in procs.state:                            # every vCPU idle
        procs.state[tid][0] = "S"
        procs.write(tid)
    sw = Switcher(fs, 500 * MS, sched=sched.knob(fs, clock), clock=clock)
    sw.apply(watched("boost", replace(member("a"), boost_ms=2)))
    gaps = []
    for _ in range(200):
        deadline = sw.tick()
        gaps.append(deadline - clock.now)
        clock.now = deadline
    assert gaps[0] == POLL and gaps[-1] == SLOWEST * POLL
    relaxed = replace(member("b"), costop_ms=3, costart_ms=2)
    sw.apply(pr.Orders(2, 500, None, (Cell("boost-a", "boost", (), (replace(member("a"), boost_ms=2),)),
                                    Cell("relaxed-b", "relaxed", (), (relaxed,)))))
    clock.now = sw.tick()                              # the relaxed guest, new, is looked at at once
    for _ in range(3):                                 # and sets the pace now: no lead, costop-ms 3
        clock.now = sw.tick()
        assert sw.tick() - clock.now == 3 * POLL
    assert sched.calls == []


class Reports:
    """The meter's long-wait reports (cosched.sampler.meter.LongWaits), made by the test."""

    def __init__(self):
        self.after, self.watching, self.pending = None, set(), []

    def set_after(self, ns):
        self.after = ns

    def watch(self, tid):
        self.watching.add(tid)

    def unwatch(self, tid):
        self.watching.discard(tid)

    def take(self):
        got, self.pending = self.pending, []
        return got


def test_a_boost_guest_whose_long_waits_are_reported_is_looked_at_only_from_a_report_until_its_boosts_end(tmp_path):
    """With the meter's reports, a boost guest's threads are reported from
    its first look on, and it is not polled: a wait beside a running sibling
    is left to the meter. The meter's report of a long wait has the guest
    looked at now and the wait boosted at that look; the guest is then looked
    at every poll until its boosts are over, and again only at a report."""
    from cosched.switcher.boosts import boost_attr
    from cosched.switcher.timing import LONG_WAIT_NS
    fs, clock, sched, reports = tree(tmp_path), Clock(), FakeSched(), Reports()
    procs = Procs(fs, (100, 101))
    for tid in procs.state:
        procs.state[tid][0] = "S"
        procs.write(tid)
    sw = Switcher(fs, 500 * MS, sched=sched.knob(fs, clock), clock=clock, long_waits=reports)
    assert reports.after == LONG_WAIT_NS
    sw.apply(watched("boost", replace(member("a"), boost_ms=2)))
    assert reports.watching == {100, 101}
    assert sw.tick() is None                             # looked at once: nothing due until a report
    clock.now += POLL
    for tid in procs.state:                              # both woke: vCPU 0 runs, vCPU 1 waits
        procs.state[tid][0] = "R"
    procs.runs(100)
    procs.write(101)
    assert sw.tick() is None and sched.calls == []       # not looked at
    reports.pending = [101, 999]                         # a thread it does not watch: ignored
    sw.take_reports(clock.now)
    assert sw.tick() == clock.now + POLL                 # a boost to end: the next poll
    assert sched.attrs[101] == boost_attr(2)
    procs.picked(101)                                    # it ran: its boost ends
    for _ in range(2 * MS // POLL + 1):                  # the runner's too, by boost-ms at the latest
        clock.now += POLL
        procs.runs(100)
        if sw.tick() is None:
            break
    assert sw.tick() is None and all(a == SchedAttr() for a in sched.attrs.values()), sched.attrs
    made = len(sched.calls)
    procs.preempted(101)                                 # a new wait beside the runner: the meter's to report
    for _ in range(3):
        clock.now += POLL
        procs.runs(100)
        assert sw.tick() is None
    assert len(sched.calls) == made
    sw.apply(pr.Orders(2, 500, None, ()))
    assert reports.watching == set()


def first_boost(fs, procs, clock, sched: FakeSched) -> Switcher:
    """A boost guest whose vCPU 0 runs while vCPU 1 waits for two polls: the switcher's first boost."""
    sw = Switcher(fs, 500 * MS, sched=sched.knob(fs, clock), clock=clock)
    sw.apply(watched("boost", replace(member("a"), boost_ms=2)))
    procs.runs(100)
    sw.tick()
    clock.now += POLL
    procs.runs(100)
    sw.tick()
    return sw


def test_bcs_falls_back_to_fifo_and_reports_when_no_boost_is_allowed(tmp_path):
    fs, clock = tree(tmp_path), Clock()
    procs = Procs(fs, (100, 101))
    pinned = FakeSched(fail={"deadline": errno.EPERM})
    first_boost(fs, procs, clock, pinned)
    assert pinned.attrs[101] == SchedAttr("fifo", priority=1)
    neither = FakeSched(fail={"deadline": errno.EPERM, "fifo": errno.EPERM})
    stats = first_boost(fs, procs, clock, neither).take_stats()
    assert stats.boost_failed["boost-a"].startswith("boost impossible for domain a")
    assert neither.calls == [] and not (stats.costop or stats.costops or stats.boosts)
    # a full deadline admission (EBUSY) skips that boost only; the guest keeps boosting
    busy = FakeSched(fail={"deadline": errno.EBUSY})
    stats = first_boost(fs, procs, clock, busy).take_stats()
    vcpus = [c for c in busy.calls if c[0] in (100, 101)]     # the other: the admission check's own child
    assert stats.boost_failed == {} and vcpus == [] and stats.long_waits_held["refused"] >= 1


def test_a_vcpu_refused_sched_deadline_takes_sched_fifo_at_once_until_a_new_plan(tmp_path):
    """A pinned vCPU (a relaxed guest's, or one libvirt pins) cannot take
    SCHED_DEADLINE: tried once, then its boosts are SCHED_FIFO straight
    away; a new plan (new pinning) tries SCHED_DEADLINE again."""
    fs, clock = tree(tmp_path), Clock()
    procs = Procs(fs, (100, 101))
    pinned = FakeSched(fail={"deadline": errno.EPERM})
    sw = first_boost(fs, procs, clock, pinned)
    for _ in range(200):                               # 101 keeps waiting behind 100: boosted again and again
        clock.now += POLL
        procs.runs(100)
        sw.tick()
    fifo = [a for tid, a in pinned.calls if tid == 101 and a == SchedAttr("fifo", priority=1)]
    assert len(fifo) >= 3 and sw.take_stats().boosts
    tried = lambda: sorted(tid for tid, a in pinned.refused if a.policy == "deadline")
    assert 101 in tried() and tried() == sorted(set(tried()))    # once per vCPU
    before = tried()
    sw.apply(watched("boost", replace(member("a"), boost_ms=3)))
    for _ in range(20):
        clock.now += POLL
        procs.runs(100)
        sw.tick()
    assert tried().count(101) == 2 and len(tried()) <= 2 * len(before)


def test_relaxed_freezes_only_the_leader_and_release_thaws_it(tmp_path):
    fs, clock, sched = tree(tmp_path), Clock(), FakeSched()
    procs = Procs(fs, (100, 101))
    sw = Switcher(fs, 500 * MS, sched=sched.knob(fs, clock), clock=clock)
    sw.apply(watched("relaxed", replace(member("a"), costop_ms=3, costart_ms=2)))
    sw.tick()
    frozen_at = None
    for _ in range(4 * MS // POLL):                    # vCPU 0 runs 4 ms ahead of vCPU 1
        clock.now += POLL
        procs.runs(100)
        sw.tick()
        if frozen_at is None and fs.read(f"{CG2}/machine/a/vcpu0/cgroup.freeze") == "1":
            frozen_at = clock.now
    assert frozen_at == 3 * MS + POLL                  # the first poll with a lead over costop-ms
    assert fs.read(f"{CG2}/machine/a/vcpu0/cgroup.freeze") == "1"
    assert fs.read(f"{CG2}/machine/a/vcpu1/cgroup.freeze") == "0"
    clock.now += 10 * MS
    sw.release_all()
    assert fs.read(f"{CG2}/machine/a/vcpu0/cgroup.freeze") == "0"
    stats = sw.take_stats()
    assert stats.costop[("a", 0)] == pytest.approx((clock.now - frozen_at) / 1e9) and stats.costops[("a", 0)] == 1


def test_relaxed_never_holds_every_vcpu_of_a_guest_still_for_a_return(tmp_path):
    """A relaxed guest's lagging vCPU returns from its boost through the zero
    reservation (held still: frozen) while its leading sibling is co-stopped:
    the co-stop ends first, so the guest never has every vCPU frozen at once."""
    fs, clock, sched = tree(tmp_path), Clock(), FakeSched()
    procs = Procs(fs, (100, 101))
    freeze = [f"{CG2}/machine/a/vcpu{i}/cgroup.freeze" for i in range(2)]
    during = []
    put = sched.set
    sched.set = lambda tid, attr: (tid == 101 and during.append((attr.policy, [fs.read(f) for f in freeze])),
                                   put(tid, attr))[1]
    sw = Switcher(fs, 500 * MS, sched=sched.knob(fs, clock), clock=clock)
    sw.apply(watched("relaxed", replace(member("a"), boost_ms=2, costop_ms=3, costart_ms=2)))
    sw.tick()
    while fs.read(freeze[0]) == "0":                   # vCPU 0 runs ahead of its queued sibling until co-stopped
        clock.now += POLL
        procs.runs(100)
        sw.tick()
    assert during and during[-1][0] == "deadline"     # vCPU 1 is boosted meanwhile
    clock.now += POLL
    procs.state[101][0] = "S"                          # it blocks: its boost ends, through the zero reservation
    procs.write(101)
    sw.tick()
    returns = [states for policy, states in during if policy != "deadline"]
    assert returns and all(states != ["1", "1"] for states in returns), during
    sw.release_all()
    assert [fs.read(f) for f in freeze] == ["0", "0"]


def test_relaxed_boosts_hold_an_rt_grant_and_give_it_back(tmp_path):
    fs, clock = tree(tmp_path, rt=True), Clock()
    Procs(fs, (100, 101))
    sw = Switcher(fs, 500 * MS, rt_top_us=900_000, sched=FakeSched().knob(fs, clock), clock=clock)
    sw.apply(replace(watched("relaxed", replace(member("a", rt=True, rt_us=100_000), boost_ms=2, costop_ms=3,
                                                    costart_ms=2)), rt_top_us=900_000))
    rt = lambda p: fs.read(f"{CPU}/machine/{p}cpu.rt_runtime_us")
    assert rt("") == "900000" and rt("a/") == "200000" and rt("a/vcpu1/") == "100000"
    sw.apply(watched("relaxed", replace(member("a", rt=True, rt_us=100_000), costop_ms=3, costart_ms=2)))
    assert rt("a/vcpu1/") == "0"                          # boosts off: the grant goes with them
    sw.release_all()
    assert {rt(p) for p in ("", "a/", "a/vcpu0/", "a/vcpu1/")} == {"0"}


def test_a_new_switcher_adopts_vcpus_a_killed_one_left_frozen(tmp_path):
    fs, clock = tree(tmp_path), Clock()
    for i in range(2):                                   # a killed switcher froze b and co-stopped c's vCPU 1
        fs.write(f"{CG2}/machine/b/vcpu{i}/cgroup.freeze", "1")
    fs.write(f"{CG2}/machine/c/vcpu1/cgroup.freeze", "1")
    sw = Switcher(fs, 300 * MS, sched=FakeSched().knob(fs, clock), clock=clock)
    sw.apply(gang(member("a"), member("b"), max_stall_ms=300))
    assert thawed(fs, "ab") == ["a"]
    clock.now += 50 * MS
    sw.tick()
    assert thawed(fs, "ab") == ["b"]                      # its slot thaws it: it was known frozen
    sw.apply(replace(watched("relaxed", replace(member("c"), costop_ms=3, costart_ms=2)), max_stall_ms=300))
    Procs(fs, (300, 301))
    clock.now += 301 * MS
    sw.tick()
    assert fs.read(f"{CG2}/machine/c/vcpu1/cgroup.freeze") == "0"   # max_stall_ms thaws a co-stop it never made


class Exits:
    """Exit descriptors of fake vCPU threads: a pipe per thread, written to when it "exits"."""

    def __init__(self, fs):
        self.ends: dict[int, int] = {}
        self.gone: set[int] = set()
        fs.exit_fd = self.open

    def open(self, tid):
        if tid in self.gone:
            raise ProcessLookupError(errno.ESRCH, "gone")
        r, self.ends[tid] = os.pipe()
        return r

    def exit(self, tid):
        self.gone.add(tid)
        os.write(self.ends[tid], b"x")


def granted_gang(tmp_path):
    """Guests a and b taking turns, boosted, each holding RT runtime, with exit descriptors."""
    fs, clock = tree(tmp_path, rt=True), Clock()
    exits = Exits(fs)
    sched = FakeSched()
    sw = Switcher(fs, 500 * MS, rt_top_us=900_000, sched=sched.knob(fs, clock), clock=clock)
    plan = gang(member("a", prio=1, rt=True, rt_us=100_000), member("b", prio=1, rt=True, rt_us=100_000),
                rt_top_us=900_000)
    return fs, clock, exits, sched, sw, plan


def test_a_co_stopped_vcpu_of_a_guest_that_ended_is_no_forced_thaw(tmp_path):
    """A guest destroyed while ``relaxed`` co-stops one of its vCPUs: nothing
    held that vCPU up, so ``max_stall_ms`` passing is no forced thaw (the
    daemon counts those as a stalled switcher's harm)."""
    fs, clock = tree(tmp_path, rt=True), Clock()
    exits = Exits(fs)
    procs = Procs(fs, (100, 101))
    sw = Switcher(fs, 500 * MS, rt_top_us=900_000, sched=FakeSched().knob(fs, clock), clock=clock)
    sw.apply(replace(watched("relaxed", replace(member("a", rt=True, rt_us=100_000), boost_ms=2, costop_ms=3,
                                                    costart_ms=2)), rt_top_us=900_000))
    sw.tick()
    for _ in range(4 * MS // POLL):                    # vCPU 0 runs 4 ms ahead of vCPU 1: co-stopped
        clock.now += POLL
        procs.runs(100)
        sw.tick()
    assert fs.read(f"{CG2}/machine/a/vcpu0/cgroup.freeze") == "1" and len(sw.grants.exits) == 2
    for tid in (100, 101):                              # its QEMU ends
        exits.exit(tid)
        sw.exited(next(fd for fd, k in sw.grants.exits.items() if k[2] == tid))
    clock.now += 501 * MS
    sw.tick()
    stats = sw.take_stats()
    assert stats.forced_thaws == 0 and not [e for e in stats.errors if "force" in e], stats


def test_a_guest_gives_its_rt_runtime_back_as_soon_as_a_vcpu_exits(tmp_path):
    # a removed cgroup that still holds RT runtime keeps counting against its
    # parent (kernel 6.18): the runtime must be back before libvirt removes it
    fs, clock, exits, sched, sw, plan = granted_gang(tmp_path)
    rt = lambda p: fs.read(f"{CPU}/machine/{p}cpu.rt_runtime_us")
    down_r, down_w = os.pipe()
    up_r, up_w = os.pipe()
    loop = threading.Thread(target=serve, args=(sw, down_r, lambda line: os.write(up_w, line.encode()), True))
    loop.start()
    try:
        os.write(down_w, pr.encode(plan).encode())
        applied(up_r, plan.seq)                           # the whole plan, not only its first writes
        assert rt("a/vcpu1/") == "100000" and len(sw.grants.exits) == 4 and sched.attrs[100] == SchedAttr("fifo", priority=1)
        exits.exit(100)                                   # guest a's QEMU ends
        until(lambda: rt("a/") == "0")
        assert rt("a/vcpu0/") == rt("a/vcpu1/") == "0" and rt("b/vcpu1/") == "100000" and rt("") == "900000"
        assert sched.attrs[101] == SchedAttr()            # its other vCPU left the group's runtime first
    finally:
        os.close(down_w)
        loop.join(5)
    assert not loop.is_alive() and sw.grants.exits == {} and rt("") == rt("b/") == "0"


def test_a_guest_whose_vcpu_exited_is_neither_granted_nor_boosted_again(tmp_path):
    fs, clock, exits, sched, sw, plan = granted_gang(tmp_path)
    rt = lambda p: fs.read(f"{CPU}/machine/{p}cpu.rt_runtime_us")
    sw.apply(plan)
    exits.exit(101)
    sw.exited(next(fd for fd, k in sw.grants.exits.items() if k[2] == 101))
    assert rt("a/") == rt("a/vcpu0/") == "0" and rt("b/") == "200000"
    sw.apply(replace(plan, seq=2))                        # the daemon has not noticed yet
    assert rt("a/") == "0"
    for active, tid in (("b", 200), ("a", 100)):         # b's slot, then a's again
        clock.now += 50 * MS
        sw.tick()
        assert thawed(fs, "ab") == [active]
    assert sched.attrs[100] == SchedAttr() and sched.attrs[200] == SchedAttr()
    assert sw.take_stats().boost_failed == {}
    clock.now += 50 * MS
    sw.tick()
    assert sched.attrs[200] == SchedAttr("fifo", priority=1)    # b boosts as before


def test_a_boost_guest_holds_rt_runtime_for_its_fifo_boosts(tmp_path):
    """RT runtime serves the SCHED_FIFO boosts within a deadline boost's
    period, and those of a vCPU refused SCHED_DEADLINE; it is held as long
    as the guest is watched and given back on release."""
    fs, clock = tree(tmp_path, rt=True), Clock()
    Exits(fs)
    procs = Procs(fs, (100, 101))
    rt = lambda p: fs.read(f"{CPU}/machine/{p}cpu.rt_runtime_us")
    plan = replace(watched("boost", replace(member("a", rt=True, rt_us=100_000), boost_ms=2)), rt_top_us=900_000)
    pinned = FakeSched(fail={"deadline": errno.EPERM})
    sw = Switcher(fs, 500 * MS, rt_top_us=900_000, sched=pinned.knob(fs, clock), clock=clock)
    sw.apply(plan)
    assert rt("") == "900000" and rt("a/") == "200000" and rt("a/vcpu1/") == "100000" and len(sw.grants.exits) == 2
    procs.runs(100)
    sw.tick()
    clock.now += POLL
    procs.runs(100)
    sw.tick()
    assert pinned.attrs[101] == SchedAttr("fifo", priority=1)
    sw.release_all()
    assert {rt(p) for p in ("", "a/", "a/vcpu0/", "a/vcpu1/")} == {"0"} and sw.grants.exits == {}


def test_a_boost_guests_sched_fifo_boosts_are_budgeted_by_its_rt_runtime(tmp_path):
    """Nine tenths of each vCPU's RT runtime per period where RT group
    scheduling grants it; no bound where it does not."""
    fs, clock = tree(tmp_path, rt=True), Clock()
    Exits(fs)
    Procs(fs, (100, 101, 200, 201))
    sw = Switcher(fs, 500 * MS, rt_top_us=900_000, sched=FakeSched().knob(fs, clock), clock=clock)
    sw.apply(replace(watched("boost", replace(member("a", rt=True, rt_us=100_000), boost_ms=2),
                             replace(member("b"), boost_ms=2)), rt_top_us=900_000))
    assert sw.watching.watched["a"].rules.fifo_budget_ns == 90 * MS
    assert sw.watching.watched["b"].rules.fifo_budget_ns is None
    sw.release_all()


def test_a_pinned_vcpus_sched_fifo_boosts_stay_within_its_rt_runtime_budget(tmp_path):
    """A vCPU refused SCHED_DEADLINE is boosted with SCHED_FIFO every time;
    all that time counts against its budget (9 ms of its group's 10 ms RT
    runtime here), or the kernel would throttle it boosted."""
    fs, clock = tree(tmp_path, rt=True), Clock()
    Exits(fs)
    procs = Procs(fs, (100, 101))
    pinned = FakeSched(fail={"deadline": errno.EPERM})
    fifo_since, spent = {}, {100: [], 101: []}
    real = pinned.set

    def timed(tid, attr):
        real(tid, attr)
        if attr == SchedAttr("fifo", priority=1):
            fifo_since[tid] = clock.now
        elif tid in fifo_since:
            spent[tid].append(clock.now - fifo_since.pop(tid))
    pinned.set = timed
    sw = Switcher(fs, 500 * MS, rt_top_us=900_000, sched=pinned.knob(fs, clock), clock=clock)
    sw.apply(replace(watched("boost", replace(member("a", rt=True, rt_us=10_000), boost_ms=2)), rt_top_us=900_000))
    for _ in range(400):                               # 101 waits behind the running 100 for 200 ms
        clock.now += POLL
        procs.runs(100)
        sw.tick()
    assert all(sum(ns) <= 9 * MS for ns in spent.values()), spent    # per vCPU group
    assert spent[101] == [2 * MS] * 4                  # four whole boosts fit in 9 ms, then it is held
    sw.release_all()


def test_a_boost_guest_whose_rt_runtime_grant_fails_boosts_with_sched_deadline_only(tmp_path, monkeypatch):
    """No RT runtime, no SCHED_FIFO boosts: said once, the deadline boosts go on."""
    fs, clock = tree(tmp_path, rt=True), Clock()
    Exits(fs)
    procs = Procs(fs, (100, 101))
    real = fs.write

    def refused(path, data):
        if path.endswith("machine/a/vcpu1/cpu.rt_runtime_us") and data != "0":
            raise OSError(errno.EINVAL, "Invalid argument")
        real(path, data)
    monkeypatch.setattr(fs, "write", refused)
    sched = FakeSched()
    sw = Switcher(fs, 500 * MS, rt_top_us=900_000, sched=sched.knob(fs, clock), clock=clock)
    sw.apply(replace(watched("boost", replace(member("a", rt=True, rt_us=100_000), boost_ms=2)), rt_top_us=900_000))
    assert len([e for e in sw.take_stats().errors if "boosts with SCHED_DEADLINE only" in e]) == 1
    for _ in range(40):                               # 101 waits behind the running 100 for 20 ms
        clock.now += POLL
        procs.runs(100)
        sw.tick()
    assert {a.policy for t, a in sched.calls if t == 101} <= {"deadline", "other"}
    assert any(a.policy == "deadline" for t, a in sched.calls if t == 101)


def test_a_boost_guest_refused_sched_fifo_boosts_with_sched_deadline_only(tmp_path):
    """Within a deadline boost's period a long wait takes SCHED_FIFO; where
    the kernel refuses that (no RT runtime to be had), the guest says so
    once and its vCPUs wait for their periods, boosted with SCHED_DEADLINE
    only."""
    from cosched.switcher.boosts import FALLBACK_BOOST, boost_attr, fresh_ns
    fs, clock = tree(tmp_path), Clock()
    procs = Procs(fs, (100, 101))
    for sched in (FakeSched(), FakeSched(fail={"fifo": errno.EPERM})):
        sw = first_boost(fs, procs, clock, sched)
        deadline = boost_attr(2, sw.watching.share)
        start = clock.now
        while clock.now < start + 4 * fresh_ns(2, sw.watching.share):
            if sched.attrs.get(101) in (deadline, FALLBACK_BOOST):
                procs.picked(101)                      # boosted: it gets a CPU, and is preempted again
                procs.preempted(101)
            clock.now += POLL
            procs.runs(100)
            sw.tick()
        boosts = [a.policy for t, a in sched.calls if t == 101 and a in (deadline, FALLBACK_BOOST)]
        errors = sw.take_stats().errors
        if not sched.fail:
            assert boosts.count("deadline") in (4, 5) and boosts.count("fifo") > 10 and errors == [], boosts
        else:
            assert boosts == ["deadline"] * len(boosts) and len(boosts) in (4, 5), boosts   # one per period
            assert len([e for e in errors if "boosts with SCHED_DEADLINE only" in e]) == 1, errors

def applied(fd, seq, timeout=5.0):
    """Read the switcher's replies from ``fd`` until it says plan ``seq`` is applied."""
    import select
    buf, end = b"", time.monotonic() + timeout
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if pr.decode(line) == pr.Applied(seq):
                return
        ready, _, _ = select.select([fd], [], [], max(end - time.monotonic(), 0))
        assert ready, f"plan {seq} not applied in time"
        buf += os.read(fd, 1 << 16)


def until(cond, timeout=5.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.005)


def test_a_guest_removed_while_holding_rt_runtime_is_named(tmp_path):
    import shutil
    fs, clock = tree(tmp_path, rt=True), Clock()
    sw = Switcher(fs, 500 * MS, rt_top_us=900_000, sched=FakeSched().knob(fs, clock), clock=clock)
    sw.apply(gang(member("a", prio=1, rt=True, rt_us=100_000), member("b", prio=1, rt=True, rt_us=100_000),
                  rt_top_us=900_000))
    shutil.rmtree(fs.path(f"{CPU}/machine/a"))             # libvirt removed it first: no exit descriptor here
    sw.apply(gang(member("b", prio=1, rt=True, rt_us=100_000), rt_top_us=900_000))
    stats = sw.take_stats()
    errors = stats.errors
    assert stats.rt_stranded_us == 200_000 and sw.take_stats().rt_stranded_us == 0     # counted once
    assert any(e.startswith(f"cgroup {CPU}/machine/a was removed holding 200000 us of RT runtime") and
               f"against {CPU}/machine " in e for e in errors), errors
    assert any(e.startswith(f"cgroup {CPU}/machine/a/vcpu1 was removed holding 100000 us") for e in errors), errors


def test_exit_fd_falls_back_to_the_process_pidfd_on_kernels_without_thread_pidfds(monkeypatch):
    import select
    from cosched.hostfs import PIDFD_THREAD, HostFS
    real, asked = os.pidfd_open, []

    def before_6_9(pid, flags=0):
        asked.append((pid, flags))
        if flags & PIDFD_THREAD:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(pid, flags)
    monkeypatch.setattr(os, "pidfd_open", before_6_9)
    done = threading.Event()
    t = threading.Thread(target=done.wait)
    t.start()
    fd = HostFS("/").exit_fd(t.native_id)
    try:
        assert asked == [(t.native_id, PIDFD_THREAD), (os.getpid(), 0)]    # this process, found by its Tgid
        done.set()
        t.join()
        assert select.select([fd], [], [], 0)[0] == []                      # the thread alone exiting: not yet
    finally:
        os.close(fd)
    assert HostFS(str(os.sep + "nonexistent")).exit_fd(1) is None            # a fake root: nothing to watch


class FakeAdmission:
    """The admission total's check answers in turn (then: right); repairs are counted."""

    def __init__(self, *wrong):
        self.answers, self.asked, self.repairs = list(wrong), 0, 0

    def wrong(self):
        self.asked += 1
        return self.answers.pop(0) if self.answers else False

    def repair(self):
        self.repairs += 1
        return self.problem

    problem = None

    def close(self):
        pass


def test_the_admission_total_is_checked_once_boosts_are_over_after_releases_or_refusals_once_a_second(tmp_path):
    """A check is due once bandwidth this switcher left counted has been
    released since the last one, or a boost was refused, at most once a
    second (every 0.1 s after a refusal with nothing to wait for); no boost
    starts until none is held and the releases are over (a second at most),
    then the total is checked and recounted if wrong (``repair``), and
    boosts start again."""
    fs, clock, sched = tree(tmp_path), Clock(), FakeSched()
    procs = Procs(fs, (100, 101))
    admission = FakeAdmission()
    sw = Switcher(fs, 500 * MS, sched=sched.knob(fs, clock, offset=lambda: 0), clock=clock, admission=admission)
    sw.apply(watched("boost", replace(member("a"), boost_ms=2)))
    knob = sw.sched
    boosts = lambda: sum(1 for tid, a in sched.calls if a.policy == "deadline" and a != zero_bandwidth(fs))

    def at(ms):
        clock.now = ms * MS
        procs.runs(100)                              # 101 waits behind the running 100
        sw.tick()
    sched.fail["deadline"] = errno.EPERM             # no boost for now (and no FIFO fallback)
    sched.fail["fifo"] = errno.EPERM
    at(0)
    knob._released = 5 * MS                          # a straight return, released at 5 ms
    at(1)
    assert admission.repairs == 0                    # a second after the switcher started at most
    assert sw.take_stats().admission_wrong is None  # not checked yet
    at(1000)
    assert admission.repairs == 1 and sw.checking_since is None   # nothing held or pending: checked at once
    assert sw.take_stats().admission_wrong is False
    knob._released = 1600 * MS
    at(1600)
    assert admission.repairs == 1                    # once a second at most
    admission.problem = "deadline admission total wrong (requests refused) and cannot be recounted: ..."
    at(2006)
    assert admission.repairs == 2 and sw.take_stats().admission_wrong is True
    admission.problem = None
    at(3100)
    assert admission.repairs == 2                    # nothing new since
    del sched.fail["deadline"], sched.fail["fifo"]
    sw.watching.watched["a"].boost_failed = None              # boosting allowed from now on (as after a new plan)
    sw.watching.watched["a"].refused.clear()
    for v in sw.watching.watched["a"].rules.vcpus:
        v.fifo_only = False
    sched.fail["deadline"] = errno.EBUSY
    at(3101)
    assert sw.counters.long_waits_held.get("refused", 0) >= 1 and admission.repairs == 3   # refused, nothing to wait for
    at(3150)
    assert admission.repairs == 3                    # refused again, 49 ms later: not yet
    at(3202)
    assert admission.repairs == 4
    del sched.fail["deadline"]
    knob._deadline[999] = (0, SchedAttr())           # a boost held, and one released at 4.35 s
    knob._released = 4350 * MS
    at(4300)
    assert sw.checking_since == 4300 * MS and admission.repairs == 4
    before = boosts()
    at(4320)
    assert boosts() == before                        # none starts meanwhile
    del knob._deadline[999]
    at(4340)
    assert admission.repairs == 4 and boosts() == before
    end = knob.released_by() // MS                   # 4.35 s, or later: the boost made at 4.3 s, returned since
    assert end >= 4350
    at(end - 1)
    assert admission.repairs == 4 and boosts() == before
    at(end + 1)
    assert admission.repairs == 5 and sw.checking_since is None
    at(end + 2)
    assert boosts() > before                         # boosting again
    knob._deadline[999] = (0, SchedAttr())           # a boost that never ends: the check waits a second at most
    knob._released = 9000 * MS                       # and a release far ahead
    at(end + 1002)
    assert sw.checking_since == (end + 1002) * MS
    at(end + 2001)
    assert admission.repairs == 5
    at(end + 2003)
    assert admission.repairs == 6 and sw.checking_since is None
    sched.fail["deadline"] = errno.EBUSY             # refused while a boost is held: once a second still
    refused = sw.counters.long_waits_held.get("refused", 0)
    at(end + 2050)
    at(end + 2200)
    assert sw.counters.long_waits_held.get("refused", 0) > refused and sw.checking_since is None
    at(end + 3004)
    assert sw.checking_since == (end + 3004) * MS          # what was still pending is checked again


def test_a_long_wait_not_boosted_while_the_admission_total_is_checked_is_counted_as_check(tmp_path):
    fs, clock, sched = tree(tmp_path), Clock(), FakeSched()
    procs = Procs(fs, (100, 101))
    sw = Switcher(fs, 500 * MS, sched=sched.knob(fs, clock), clock=clock, admission=FakeAdmission())
    sw.apply(watched("boost", replace(member("a"), boost_ms=2)))
    sw.sched._deadline[999] = (0, SchedAttr())          # a boost held elsewhere: the check waits
    sw.checking_since = 0
    for _ in range(10):
        clock.now += POLL
        procs.runs(100)                                  # 101 waits behind the running 100
        sw.tick()
    held = sw.take_stats().long_waits_held
    assert held.get("check", 0) >= 1 and held.get("room", 0) == 0, held
    assert not [a for tid, a in sched.calls if tid == 101]    # not boosted


def test_a_watch_is_taken_again_when_a_vcpus_return_changes(tmp_path):
    """A vCPU's return (its original, its quiet time) travels beside the
    plan: a changed one is a new watch, as a changed plan is."""
    fs, clock, sched = tree(tmp_path), Clock(), FakeSched()
    sw = Switcher(fs, 500 * MS, sched=sched.knob(fs, clock), clock=clock)
    a = replace(member("a"), boost_ms=2)
    sw.apply(watched("boost", a, returns=back(a)))
    first = sw.watching.watched["a"]
    sw.apply(watched("boost", a, returns=back(a)))
    assert sw.watching.watched["a"] is first
    sw.apply(watched("boost", a, returns=back(a, SchedAttr("batch", nice=3))))
    assert sw.watching.watched["a"] is not first
    assert sw.vcpus.original[("a", 0, 100, f"{CG2}/machine/a/vcpu0/cgroup.freeze")] == SchedAttr("batch", nice=3)
    sw.release_all()


def test_a_rotation_costs_one_wake_up_per_slot_change(tmp_path, monkeypatch):
    """Two guests taking 30 ms turns change slot about 33 times a second;
    the reports (10 a second) ride on those wake-ups instead of adding
    their own (which made about 43)."""
    import select as real
    from cosched.switcher import loop as loop_module
    wakes = []

    class Counting:
        def select(self, *args):
            wakes.append(time.monotonic())
            return real.select(*args)
    monkeypatch.setattr(loop_module, "select", Counting())
    fs = tree(tmp_path)
    sw = Switcher(fs, 500 * MS, sched=FakeSched().knob(fs, time.monotonic_ns))
    plan = gang(member("a", slot=30), member("b", slot=30))
    down_r, down_w = os.pipe()
    up_r, up_w = os.pipe()
    reports = []
    loop = threading.Thread(target=serve, args=(sw, down_r, lambda line: os.write(up_w, line.encode()), True))
    loop.start()
    try:
        os.write(down_w, pr.encode(plan).encode())
        applied(up_r, plan.seq)
        start = len(wakes)
        time.sleep(2.0)
        counted = wakes[start:]
        buf = b""
        while real.select([up_r], [], [], 0)[0]:
            buf += os.read(up_r, 1 << 16)
        reports = [m for m in map(pr.decode, buf.splitlines()) if isinstance(m, pr.Stats)]
    finally:
        os.close(down_w)
        loop.join(5)
    per_s = len(counted) / (counted[-1] - counted[0])
    assert 15 <= per_s <= 38, per_s
    assert len(reports) >= 15, len(reports)              # still about 10 reports a second
