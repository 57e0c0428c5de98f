"""The scheduling knob (boosts and their returns) on a fake host: SCHED_DEADLINE's zero reservation, straight returns, fresh budgets, admission shares."""
import contextlib
import threading

import pytest
from tests.support.fakehost import FakeSched

from cosched.actuators.journal import Target
from cosched.actuators.sched import (LEAVE_MARGIN_NS, SchedAttr, SchedKnob, kernel_clock_offset, zero_bandwidth)

from tests.unit.actuators.test_journal import threads


def test_sched_attr_names_every_policy_and_refuses_unknown_ones():
    for policy in ("other", "batch", "idle", "fifo", "rr", "deadline"):
        assert SchedAttr.from_json(SchedAttr(policy).to_json()) == SchedAttr(policy)
    with pytest.raises(ValueError, match="unknown scheduling policy"):
        SchedAttr("turbo")


DL = SchedAttr("deadline", runtime_ns=4_000_000, deadline_ns=400_000_000, period_ns=400_000_000)


def test_a_thread_leaves_deadline_through_zero_bandwidth(fake, fs):
    """The kernel keeps the bandwidth of a deadline thread that leaves while
    asleep: every way out of SCHED_DEADLINE passes through a reservation of 0."""
    fake.write("/proc/sys/kernel/sched_deadline_period_max_us", "1000000\n")
    zero = SchedAttr("deadline", runtime_ns=1024, deadline_ns=1_000_000_000, period_ns=1_000_000_000)
    assert zero_bandwidth(fs) == zero
    sched = FakeSched()
    knob = sched.knob(fs)
    knob.apply(7, DL)
    knob.apply(7, SchedAttr("other"))
    knob.apply(8, SchedAttr("fifo", priority=1))           # never a deadline thread: one write
    knob.apply(8, SchedAttr("other"))
    knob.apply(9, DL)
    knob.apply(9, SchedAttr("deadline", runtime_ns=1_000_000, deadline_ns=10_000_000, period_ns=10_000_000))
    assert sched.calls == [(7, DL), (7, zero), (7, SchedAttr("other")),
                           (8, SchedAttr("fifo", priority=1)), (8, SchedAttr("other")), (9, DL), sched.calls[-1]]
    # restoring a journal entry asks the thread itself (the daemon that boosted it may have died)
    threads(fake, 10)
    sched.attrs[10], sched.calls[:] = DL, []
    (entry,) = SchedKnob(fs, get=sched.get, put=sched.set).record(Target("vm", "u", 0, 10, 1010), {}).values()
    entry["attr"] = SchedAttr("other", nice=3).to_json()
    SchedKnob(fs, get=sched.get, put=sched.set).restore(entry)
    assert sched.calls == [(10, zero), (10, SchedAttr("other", nice=3))]


def test_a_thread_returned_when_its_deadline_may_be_past_is_kept_from_deadline_for_the_zero_period(fake, fs):
    """The zero reservation can give a thread whose deadline has passed a new
    one its whole period away, which its next boost would inherit: the knob
    says until when (a return within the boost's deadline, none)."""
    fake.write("/proc/sys/kernel/sched_deadline_period_max_us", "1000000\n")
    now = [0]
    sched = FakeSched()
    knob = sched.knob(fs, clock=lambda: now[0])
    boost = SchedAttr("deadline", runtime_ns=1_000_000, deadline_ns=10_000_000, period_ns=10_000_000)
    knob.apply(7, boost)
    now[0] = 9_000_000
    knob.apply(7, SchedAttr("other"))                      # within its deadline
    assert knob.quiet_until(7) == 0
    knob.apply(7, boost)
    now[0] += 10_000_000
    knob.apply(7, SchedAttr("other"))                      # at its deadline: held up
    assert knob.quiet_until(7) == now[0] + 1_000_000_000
    # a restore does not know when the boost began: always kept
    threads(fake, 10)
    sched.attrs[10] = boost
    (entry,) = knob.record(Target("vm", "u", 0, 10, 1010), {}).values()
    entry["attr"] = SchedAttr("other").to_json()
    now[0] += 2_000_000_000                                # 7's time is over, and forgotten
    knob.restore(entry)
    assert (knob.quiet_until(10), knob.quiet_until(7), knob._quiet.keys()) == (now[0] + 1_000_000_000, 0, {10})
    knob.apply(8, SchedAttr("other"))                      # never a deadline thread
    assert knob.quiet_until(8) == 0


def test_a_leaving_deadline_thread_returns_straight_when_the_kernel_lets_go_of_it_itself(fake, fs):
    """A runnable thread returns straight to its policy when its zero-lag
    time (deadline less budget at the reservation's rate) lies more than
    the margin ahead, or its budget has run out; its next boost then waits
    until that time. Asleep, runnable on a budget with that time near, or
    not readable: through the zero reservation, kept still around both
    calls."""
    fake.write("/proc/sys/kernel/sched_deadline_period_max_us", "1000000\n")
    now = [0]
    sched = FakeSched()
    offset = -500_000                                       # the kernel's clock runs behind
    knob = sched.knob(fs, clock=lambda: now[0], offset=lambda: offset)
    zero = zero_bandwidth(fs)
    boost = SchedAttr("deadline", runtime_ns=4_000_000, deadline_ns=8_000_000, period_ns=8_000_000)
    straight, through_zero = [SchedAttr("other")], [zero, SchedAttr("other")]

    kept = []

    @contextlib.contextmanager
    def still():
        kept.append(len(sched.calls))
        yield
        kept.append(len(sched.calls))

    def returned(budget, ahead, state="R"):
        now[0] += 20_000_000
        knob.apply(7, boost)
        now[0] += 3_000_000
        fake.write("/proc/7/sched", f"policy : 6\nprio : -1\ndl.runtime : {budget}\n"
                                    f"dl.deadline : {now[0] + (offset or 0) + ahead}\n")
        fake.stat(1, 7, "CPU 0/TCG", state) if state else fake.write("/proc/7/stat", "")
        sched.calls.clear()
        kept.clear()
        knob.apply(7, SchedAttr("other"), still=still)
        calls = [attr for _, attr in sched.calls]
        if kept:                                        # kept still around both calls
            assert kept == [0, 2] and calls == through_zero
            calls = ["still"] + calls
        return calls, knob.quiet_until(7) - now[0]

    margin = LEAVE_MARGIN_NS
    # runnable, zero-lag time ahead: straight, with budget or without
    assert returned(1_500_000, 5_000_000) == (straight, 2_000_000 + margin)
    assert returned(876_142, 19_000_000) == (straight, 19_000_000 - 2 * 876_142 + margin)
    assert returned(-620_444, 5_000_000) == (straight, 5_000_000 + 2 * 620_444 + margin)
    assert returned(-18_843, 4_000_000_000) == (straight, 4_000_000_000 + 2 * 18_843 + margin)   # far: held long
    now[0] += 4_100_000_000
    # runnable, zero-lag time near or behind: straight only with its budget run out
    assert returned(-100, -2_000_000) == (straight, margin)
    assert returned(0, 500_000) == (straight, 500_000 + margin)
    for budget, ahead in ((3_000_000, 6_500_000), (margin, 2_000_000)):
        calls, hold = returned(budget, ahead)
        assert calls == ["still"] + through_zero and hold < 0
    # asleep: through the zero reservation, kept still (it may have fallen asleep before it was a deadline thread)
    for budget, ahead in ((-620_444, 5_000_000), (-100, -2_000_000), (1_500_000, 5_000_000)):
        calls, hold = returned(budget, ahead, "S")
        assert calls == ["still"] + through_zero and hold < 0
    assert returned(-100, 5_000_000, None)[0] == ["still"] + through_zero      # its state unreadable: so too
    offset = None                                           # the clocks cannot be compared: as before
    knob._offset_at = None
    calls, hold = returned(-620_444, 5_000_000)                # within its deadline: not held
    assert calls == ["still"] + through_zero and hold < 0
    offset = -500_000
    knob._offset_at = None
    fake.stat(1, 7, "CPU 0/TCG", "R")
    fake.write("/proc/7/sched", "policy : 0\n")            # no budget shown: as before
    knob.apply(7, boost)
    sched.calls.clear()
    knob.apply(7, SchedAttr("other"))
    assert sched.calls == [(7, zero), (7, SchedAttr("other"))]


def test_a_boost_that_found_an_old_budget_is_not_fresh(fake, fs):
    """A deadline reservation that found a deadline already passed, or one
    further away than its own, left from an earlier one, has nothing to
    run on; a budget spent within its own period was run; where nothing
    can be read, or the thread is asleep, it is taken as fresh."""
    now = [50_000_000]
    sched = FakeSched()
    knob = sched.knob(fs, clock=lambda: now[0], offset=lambda: 0)
    boost = SchedAttr("deadline", runtime_ns=4_000_000, deadline_ns=8_000_000, period_ns=8_000_000)
    fake.stat(1, 7, "CPU 0/TCG", "R")
    knob.apply(7, boost)
    assert knob.fresh(7)                                    # nothing shown
    for budget, ahead, fresh in ((4_000_000, 8_000_000, True), (1_000, 2_000_000, True), (-838_177, 6_000_000, True),
                                 (-65_955, -4_190_000_000, False), (1_024, 3_000_000_000, False),
                                 (4_000_000, 8_000_000 + LEAVE_MARGIN_NS, True), (-912_928, -1_385_897, False)):
        fake.write("/proc/7/sched", f"dl.runtime : {budget}\ndl.deadline : {now[0] + ahead}\n")
        assert knob.fresh(7) is fresh, (budget, ahead)
    fake.stat(1, 7, "CPU 0/TCG", "S")
    assert knob.fresh(7)                 # asleep: the kernel gives it a budget when it wakes
    assert knob.fresh(8)                                    # not given one by this knob


def test_a_deadline_budget_is_read_from_the_sched_text():
    from cosched.kernel import parse_dl
    assert parse_dl("policy : 6\ndl.runtime                 :              -92000\n"
                    "dl.deadline   :       42921864683055\n") == (-92000, 42921864683055)
    assert parse_dl("policy : 0\nse.vruntime : 966.190748\n") is None
    assert parse_dl("dl.runtime : x\ndl.deadline : 1\n") is None and parse_dl(None) is None


def test_the_kernel_clock_is_not_known_where_no_thread_can_start(fs, monkeypatch):
    """A SCHED_DEADLINE process may not start threads (EAGAIN): no offset,
    and the knob returns spent threads through the zero reservation."""
    def refused(self):
        raise RuntimeError("can't start new thread")
    monkeypatch.setattr(threading.Thread, "start", refused)
    assert kernel_clock_offset(fs) is None


def test_each_boost_holds_what_admission_allows_per_cpu_up_to_half(fake, fs):
    from cosched.switcher.boosts import MAX_SHARE, boost_share
    assert boost_share(fs) == MAX_SHARE                                # 95% by default, less the fair server
    fake.write("/proc/sys/kernel/sched_rt_runtime_us", "300000\n")
    fake.write("/proc/sys/kernel/sched_rt_period_us", "1000000\n")
    assert boost_share(fs) == pytest.approx(0.9 * 0.25)
    fake.write("/proc/sys/kernel/sched_rt_runtime_us", "-1\n")           # no limit
    assert boost_share(fs) == MAX_SHARE


def test_zero_bandwidth_without_the_sysctl_is_one_second(fs):
    assert zero_bandwidth(fs).period_ns == 1_000_000_000


