"""The rules of ``boost`` (BCS) and ``relaxed`` on synthetic poll streams."""
import pytest
from hypothesis import given, settings, strategies as st

from cosched.kernel import status_field, switch_outs
from cosched.policy.watch import CALM_LOOKS, SLOWEST, BoostRules, Look, RelaxedRules, on_cpu_unchanged

MS = 1_000_000


class Thread:
    """A synthetic vCPU thread: what a poll of /proc would show. It starts queued."""

    def __init__(self, cpu=0):
        self.run, self.picks, self.runnable, self.on_cpu, self.cpu = 0, 1, True, False, cpu

    def seen(self):
        return Look(self.runnable, self.cpu, self.run, self.picks, self.on_cpu)

    def runs(self, ns):            # on a CPU through the window (switched in first if it was not)
        if not self.on_cpu:
            self.picks += 1
        self.runnable, self.on_cpu, self.run = True, True, self.run + ns

    def waits(self):               # queued (preempted first if it was running)
        self.runnable, self.on_cpu = True, False

    def picked(self):              # switched in
        self.runnable, self.on_cpu, self.picks = True, True, self.picks + 1

    def ran_unseen(self, ns):      # ran between two polls, queued again by the next
        self.picks += 1
        self.runnable, self.on_cpu, self.run = True, False, self.run + ns

    def sleeps(self):
        self.runnable, self.on_cpu = False, False


def poll(rules, now, threads, room=4):
    return rules.step(now, [t.seen() for t in threads], room)


def test_on_cpu_follows_from_the_last_poll_only_while_nothing_changed():
    running, queued = Look(True, 0, 500, 3, True), Look(True, 0, 500, 3, False)
    asleep = Look(False, 0, 500, 3, False)
    assert on_cpu_unchanged(running, True, 500, 3) is True       # no switch-out: still on its CPU
    assert on_cpu_unchanged(queued, True, 500, 3) is False       # no switch-in: still queued
    assert on_cpu_unchanged(asleep, True, 500, 3) is False       # woken, not yet switched in
    assert on_cpu_unchanged(running, False, 500, 3) is False     # not runnable: on no CPU
    assert on_cpu_unchanged(running, True, 900, 3) is None       # a tick or a switch-out: count them
    assert on_cpu_unchanged(queued, True, 500, 4) is None        # switched in, maybe out again
    assert on_cpu_unchanged(None, True, 500, 3) is None


# -- boost (BCS) -----------------------------------------------------------
def test_bcs_boosts_a_wait_reported_long_at_the_first_look_that_sees_it():
    """Looks alone call a wait long when two in a row see it; one the meter
    reports long (``long``) is boosted at the first look, with the runner
    held; a report of a vCPU that no longer waits boosts nothing."""
    a, b = Thread(cpu=0), Thread(cpu=1)
    a.runs(MS)
    looks, told = BoostRules(2, boost_ns=2 * MS, pause_ns=2 * MS), BoostRules(2, boost_ns=2 * MS, pause_ns=2 * MS)
    assert poll(looks, 0, [a, b]).boost == []
    assert sorted(told.step(0, [a.seen(), b.seen()], 4, long={1}).boost) == [0, 1]
    late = BoostRules(2, boost_ns=2 * MS, pause_ns=2 * MS)
    b.picked()                                          # switched in between the report and the look
    assert late.step(0, [a.seen(), b.seen()], 4, long={1}).boost == []


def test_bcs_boosts_a_waiting_sibling_until_it_has_run_and_holds_the_runner_meanwhile():
    a, b = Thread(cpu=0), Thread(cpu=1)
    bcs = BoostRules(2, boost_ns=2 * MS, pause_ns=2 * MS)
    b.sleeps()
    assert poll(bcs, 0, [a, b]).boost == []            # a queued, b idle: nobody to co-start with
    a.runs(MS)
    b.waits()
    assert poll(bcs, 1 * MS, [a, b]).boost == []       # seen waiting once: most such waits end by themselves
    a.runs(MS)
    acts = poll(bcs, 2 * MS, [a, b])                   # still waiting, never switched in: a long wait
    assert acts.boost == [1, 0] and acts.unboost == [] and bcs.boosted == [0, 1]
    b.picked()                                         # the host scheduler started it: its boost is done
    a.runs(MS)                                         # a runs on, never switched out: still held
    acts = poll(bcs, 3 * MS, [a, b])
    assert acts.unboost == [1] and acts.boost == [] and bcs.boosted == [0]


def test_bcs_ends_a_boost_after_boost_ms_and_pauses_pause_ms_before_the_next():
    a, b = Thread(cpu=0), Thread(cpu=1)
    bcs = BoostRules(2, boost_ns=2 * MS, pause_ns=2 * MS)
    a.runs(MS)
    poll(bcs, 0, [a, b])
    a.runs(MS)
    assert poll(bcs, 1 * MS, [a, b]).boost == [1, 0]
    a.runs(MS)
    assert poll(bcs, 2 * MS, [a, b]).unboost == []     # 1 ms boosted: still on
    a.runs(MS)
    acts = poll(bcs, 3 * MS, [a, b])
    assert acts.unboost == [0, 1]                      # 2 ms: off, though b never ran
    assert acts.held == {"pause": 1}                   # and b, waiting on, is held back: counted
    a.runs(MS)
    acts = poll(bcs, 4 * MS, [a, b])
    assert acts.boost == [] and acts.held == {}        # quiet for pause-ms; the same wait counted once
    a.runs(MS)
    assert poll(bcs, 5 * MS, [a, b]).boost == [1, 0]


def test_bcs_pause_ms_zero_boosts_again_from_the_next_look():
    a, b = Thread(cpu=0), Thread(cpu=1)
    bcs = BoostRules(2, boost_ns=2 * MS, pause_ns=0)
    a.runs(MS)
    poll(bcs, 0, [a, b])
    a.runs(MS)
    assert poll(bcs, 1 * MS, [a, b]).boost == [1, 0]
    a.runs(MS)
    poll(bcs, 2 * MS, [a, b])
    a.runs(MS)
    acts = poll(bcs, 3 * MS, [a, b])                   # boost-ms over: off, not on again in the same look
    assert (acts.unboost, acts.boost, acts.held) == ([0, 1], [], {"pause": 1})
    a.runs(MS)
    assert poll(bcs, 3.5 * MS, [a, b]).boost == [1, 0]  # the next look: b still waits, boosted again


def test_bcs_boosts_a_vcpu_again_only_once_its_last_boosts_period_is_over():
    """With a 5 ms reservation period, a vCPU boosted at 1 ms is not boosted
    again before 6 ms, whatever pause-ms: until then the kernel would hand
    it what its last boost left."""
    a, b = Thread(cpu=0), Thread(cpu=1)
    bcs = BoostRules(2, boost_ns=2 * MS, pause_ns=0, period_ns=5 * MS)
    for t in (0, 1):
        a.runs(MS)
        poll(bcs, t * MS, [a, b])
    for t in (2, 3):
        a.runs(MS)
        acts = poll(bcs, t * MS, [a, b])
    assert acts.unboost == [0, 1]                     # boosted at 1 ms, over at 3 ms
    for t in (3.5, 4, 5, 5.5):
        a.runs(MS)
        assert poll(bcs, t * MS, [a, b]).boost == [], t
    a.runs(MS)
    assert poll(bcs, 6 * MS, [a, b]).boost == [1, 0]


def test_bcs_with_fifo_boosts_within_a_period_with_sched_fifo_and_with_deadline_after_it():
    """With ``fifo``, a long wait of a vCPU whose last deadline boost began
    less than a period ago is boosted with SCHED_FIFO instead of held; a
    SCHED_FIFO boost starts no period, and the kernel's hold (:meth:`BoostRules.hold`)
    binds only deadline boosts."""
    a, b = Thread(cpu=0), Thread(cpu=1)
    bcs = BoostRules(2, boost_ns=2 * MS, pause_ns=0, period_ns=5 * MS, fifo=True)
    for t in (0, 1):
        a.runs(MS)
        acts = poll(bcs, t * MS, [a, b])
    assert (acts.boost, acts.fifo) == ([1, 0], [])     # deadline boosts, from 1 ms
    for t in (2, 3):
        a.runs(MS)
        acts = poll(bcs, t * MS, [a, b])
    assert acts.unboost == [0, 1] and acts.held == {"pause": 1}    # over at 3 ms, b waiting on
    a.runs(MS)
    acts = poll(bcs, 3.5 * MS, [a, b])
    assert (acts.boost, acts.fifo) == ([1, 0], [1, 0])  # the next look: within the period, SCHED_FIFO
    b.picked()
    a.runs(MS)
    assert poll(bcs, 4 * MS, [a, b]).unboost == [1]     # it ran: over
    b.waits()
    for t in (4.5, 5):
        a.runs(MS)
        acts = poll(bcs, t * MS, [a, b])
    assert (acts.boost, acts.fifo) == ([1], [1])        # a long wait again, still within the period
    b.picked()
    a.runs(MS)
    assert poll(bcs, 5.5 * MS, [a, b]).unboost == [0, 1]   # a's boost-ms over, b ran
    b.waits()
    for t in (6, 6.5):
        a.runs(MS)
        acts = poll(bcs, t * MS, [a, b])
    assert (acts.boost, acts.fifo) == ([1, 0], [])     # both periods over at 6 ms: deadline boosts
    bcs.hold(1, 20 * MS)                                # the kernel holds b's deadline until 20 ms
    b.picked()
    a.runs(MS)
    assert poll(bcs, 7 * MS, [a, b]).unboost == [1]
    b.waits()
    for t in (7.5, 8):
        a.runs(MS)
        acts = poll(bcs, t * MS, [a, b])
    assert (acts.boost, acts.fifo) == ([1], [1])        # held for deadline boosts: SCHED_FIFO
    assert all(v.fifo_spent == [] for v in bcs.vcpus)   # no budget: nothing kept to count against one


@pytest.mark.parametrize("fifo_why", ["held for deadline boosts", "refused SCHED_DEADLINE"])
def test_bcs_holds_sched_fifo_boosts_past_their_runtime_budget_until_the_window_moves_on(fifo_why):
    """A vCPU's SCHED_FIFO boosts may last ``fifo_budget_ns`` in all over any
    second (its RT runtime: past it the kernel would throttle it); a long
    wait beyond is held (``runtime``) until a deadline boost or the window
    allows one. A vCPU refused SCHED_DEADLINE (pinned to a subset of CPUs)
    has only SCHED_FIFO boosts, all counted."""
    from cosched.policy.watch import FIFO_WINDOW_NS
    a, b = Thread(cpu=0), Thread(cpu=1)
    bcs = BoostRules(2, boost_ns=2 * MS, pause_ns=0, period_ns=100 * MS, fifo=True, fifo_budget_ns=5 * MS)
    for i in (0, 1):                                    # no deadline boosts at all here
        bcs.hold(i, 10 * FIFO_WINDOW_NS) if fifo_why.startswith("held") else bcs.fifo_only(i)
    boosted, held = [], {}
    t = 0
    while t < 30 * MS:
        a.runs(MS)
        if 1 in bcs.boosted:
            b.ran_unseen(MS)                            # it got a CPU for a while, and is queued again
        acts = poll(bcs, t, [a, b])
        boosted += [(t, i) for i in acts.boost]
        assert acts.fifo == acts.boost
        for why, n in acts.held.items():
            held[why] = held.get(why, 0) + n
        t += MS // 2
    # each boost of b lasts one look (0.5 ms): boosted while what it spent and a whole boost fit in 5 ms
    assert [i for _, i in boosted].count(1) == 7 and held.get("runtime") == 1, (boosted, held)
    assert max(t for t, i in boosted if i == 1) == 6.5 * MS
    a.runs(MS)
    assert 1 not in poll(bcs, FIFO_WINDOW_NS // 2, [a, b]).boost   # half a window on: still spent
    late = FIFO_WINDOW_NS + boosted[0][0] + 2 * MS        # the first boosts' time has left the window
    a.runs(MS)
    acts = poll(bcs, late, [a, b])
    assert 1 in acts.boost and acts.fifo == acts.boost


def test_bcs_boosts_the_runner_first_when_siblings_share_a_cpu():
    a, b = Thread(cpu=1), Thread(cpu=1)                # CFS stacked both on CPU 1
    bcs = BoostRules(2, boost_ns=2 * MS, pause_ns=2 * MS)
    a.runs(MS)
    poll(bcs, 0, [a, b])
    a.runs(MS)
    acts = poll(bcs, 1 * MS, [a, b])
    assert acts.boost == [0, 1]                        # two boosted threads on one CPU: the kernel pushes one
    a.runs(MS)
    b.picked(), b.waits()                              # b ran (its boost ends) and is queued again
    assert poll(bcs, 2 * MS, [a, b]).unboost == [1]
    a.runs(MS)
    acts = poll(bcs, 3 * MS, [a, b])                   # a's boost ends after boost-ms; b's wait is long,
    assert acts.unboost == [0] and acts.held == {"pause": 1}   # b in its pause
    a.runs(MS)
    assert poll(bcs, 4 * MS, [a, b]).boost == []       # b's pause is over, not that of the runner it needs
    a.runs(MS)
    assert poll(bcs, 5 * MS, [a, b]).boost == [0, 1]


def test_bcs_never_boosts_idle_vcpus_or_without_a_running_sibling():
    a, b, c = Thread(0), Thread(1), Thread(1)
    bcs = BoostRules(3, boost_ns=2 * MS, pause_ns=2 * MS)
    poll(bcs, 0, [a, b, c])
    a.sleeps(), b.waits(), c.waits()                   # nobody ran: no trigger
    assert poll(bcs, 1 * MS, [a, b, c]).boost == []
    a.runs(MS), b.sleeps(), c.sleeps()                 # siblings idle: nothing to co-start
    assert poll(bcs, 2 * MS, [a, b, c]).boost == []


def test_bcs_respects_the_room_it_is_given():
    threads = [Thread(cpu=i) for i in range(4)]
    bcs = BoostRules(4, boost_ns=2 * MS, pause_ns=2 * MS)
    threads[0].runs(MS)
    poll(bcs, 0, threads)
    threads[0].runs(MS)
    acts = poll(bcs, 1 * MS, threads, room=2)
    assert acts.boost == [1, 2] and acts.held == {"room": 1}    # vCPU 3 waits on: counted
    assert poll(BoostRules(4, 2 * MS, 2 * MS), 0, threads, room=0).boost == []
    assert poll(bcs, 1.5 * MS, threads, room=0).held == {}      # the same wait of vCPU 3: counted once


def test_bcs_boosts_only_a_wait_seen_at_two_looks():
    a, b = Thread(cpu=0), Thread(cpu=1)
    bcs = BoostRules(2, boost_ns=2 * MS, pause_ns=2 * MS)
    b.sleeps()
    poll(bcs, 0, [a, b])
    a.runs(MS), b.waits()                              # b woke: queued behind something
    assert poll(bcs, 1 * MS, [a, b]).boost == []       # most such waits are over by the next poll
    b.picked(), b.waits()                              # this one was: run, then queued again
    assert poll(bcs, 2 * MS, [a, b]).boost == []       # a new wait, seen once
    a.runs(MS)
    assert poll(bcs, 3 * MS, [a, b]).boost == [1, 0]   # the same wait, seen twice: long


def test_bcs_looks_less_often_without_long_waits_and_at_once_when_one_may_start():
    a, b = Thread(cpu=0), Thread(cpu=1)
    bcs = BoostRules(2, boost_ns=2 * MS, pause_ns=2 * MS)
    paces = []
    for t in range(CALM_LOOKS * 6):                    # both run on their own CPUs: no waits at all
        a.runs(MS), b.runs(MS)
        poll(bcs, t * MS, [a, b])
        paces.append(bcs.next_in)
    assert paces[CALM_LOOKS - 2] == 1 and paces[CALM_LOOKS - 1] == 2
    assert paces[2 * CALM_LOOKS - 1] == 4 and paces[-1] == SLOWEST == bcs.every
    b.waits()                                          # b queued while a runs: look again next poll
    acts = poll(bcs, 1000 * MS, [a, b])
    assert (acts.boost, bcs.next_in, bcs.every) == ([], 1, SLOWEST)
    a.runs(MS)
    assert poll(bcs, 1001 * MS, [a, b]).boost == [1, 0] and bcs.next_in == bcs.every == 1
    b.sleeps()
    for t in range(CALM_LOOKS):                        # after a long wait: every poll, until calm again
        assert bcs.next_in == 1
        a.runs(MS)
        poll(bcs, (1002 + t) * MS, [a, b])
    assert bcs.next_in == 2


def test_bcs_with_reported_long_waits_asks_for_looks_only_while_a_boost_or_a_long_wait_is_open():
    """Reported, a guest needs no look while nothing is boosted and no long
    wait is unanswered, not even beside a runner (the meter reports it when
    it turns long); a reported wait held back by the pause is looked at every
    poll and boosted once the pause is over."""
    a, b = Thread(cpu=0), Thread(cpu=1)
    bcs = BoostRules(2, boost_ns=2 * MS, pause_ns=2 * MS)
    bcs.reported = True
    a.runs(MS), b.runs(MS)
    poll(bcs, 0, [a, b])
    assert bcs.next_in is None
    b.waits()
    a.runs(MS)
    assert poll(bcs, 1 * MS, [a, b]).boost == [] and bcs.next_in is None
    a.runs(MS)
    assert bcs.step(2 * MS, [a.seen(), b.seen()], 4, long={1}).boost == [1, 0] and bcs.next_in == 1
    b.picked()
    a.runs(MS)
    assert sorted(poll(bcs, 3 * MS, [a, b]).unboost) == [1]
    a.runs(MS)
    assert poll(bcs, 4 * MS, [a, b]).unboost == [0] and bcs.next_in is None   # boost-ms over: no look needed
    b.waits()
    a.runs(MS)
    acts = bcs.step(4 * MS + MS // 2, [a.seen(), b.seen()], 4, long={1})
    assert acts.boost == [] and acts.held == {"pause": 1} and bcs.next_in == 1
    for t in range(5, 8):
        a.runs(MS)
        acts = poll(bcs, t * MS, [a, b])
        if acts.boost:
            break
        assert bcs.next_in == 1
    assert acts.boost == [1] and t * MS >= 3 * MS + 2 * MS    # its last boost ended at 3 ms, the pause 2 ms


def test_bcs_looks_at_a_guest_whose_vcpus_mostly_sleep_as_at_a_busy_one():
    """A pingpong guest's vCPUs idle more than half their active time, and
    its waits gain from boosts that come soon: looked at every fourth poll
    at the most, 19-41% of them were boosted within 1 ms, against 60-76%."""
    a, b = Thread(cpu=0), Thread(cpu=1)
    bcs = BoostRules(2, boost_ns=2 * MS, pause_ns=2 * MS)
    for t in range(CALM_LOOKS * 4):                    # both run at a quarter of the looks, else both sleep
        if t % 4 == 0:
            a.runs(MS)
            b.runs(MS)
        else:
            a.sleeps(), b.sleeps()
        poll(bcs, t * MS, [a, b])
    a.runs(MS), b.waits()
    poll(bcs, 1000 * MS, [a, b])
    assert bcs.next_in == 1                            # a wait while a sibling runs: the next poll
    a.runs(MS)
    assert poll(bcs, 1001 * MS, [a, b]).boost == [1, 0]
    assert bcs.every == bcs.next_in == 1


def test_relaxed_looks_sooner_as_a_lead_nears_costop_and_every_poll_while_it_costops():
    """No later than half the time the largest lead needs to pass costop-ms."""
    a, b = Thread(0), Thread(1)
    rel = RelaxedRules(2, costop_ns=3 * MS, costart_ns=2 * MS, boost_ns=2 * MS, pause_ns=2 * MS, poll_ns=MS // 2)
    assert rel.next_in == 1                            # not looked at yet
    poll(rel, 0, [a, b])
    assert rel.next_in == 3                            # no lead: 3 ms to go, looked at within 1.5 ms
    a.runs(MS)
    poll(rel, MS, [a, b])                              # a leads by 1 ms: 2 ms to go
    assert rel.next_in == 2
    a.runs(MS)
    poll(rel, 2 * MS, [a, b])
    assert rel.next_in == 1
    for t in (3, 4):
        a.runs(MS)
        poll(rel, t * MS, [a, b])
    assert rel.frozen == [0] and rel.next_in == 1      # co-stopped (and b boosted): every poll
    assert RelaxedRules(2, 3 * MS, 2 * MS).next_in == 1     # no poll interval given: every poll


def test_relaxed_a_vcpu_asleep_at_the_last_look_owes_nothing_for_the_time_since():
    """Looked at 1.5 ms apart, a sibling that slept through most of it and
    now waits has not lagged the one that ran."""
    a, b = Thread(0), Thread(1)
    rel = RelaxedRules(2, costop_ns=3 * MS, costart_ns=2 * MS, poll_ns=MS // 2)
    b.sleeps()
    poll(rel, 0, [a, b])
    a.runs(3 * MS // 2)
    b.waits()                                          # woke just before this look
    poll(rel, 3 * MS // 2, [a, b])
    assert rel.leads([a.seen(), b.seen()]) == [0, 0] and rel.next_in == 3


# -- relaxed ---------------------------------------------------------------
def test_relaxed_costops_a_leader_and_costarts_it_when_the_laggard_caught_up():
    a, b = Thread(0), Thread(1)
    rel = RelaxedRules(2, costop_ns=3 * MS, costart_ns=2 * MS)
    poll(rel, 0, [a, b])
    frozen_at = None
    for t in range(1, 5):                              # a runs, b waits behind another guest
        a.runs(MS)
        acts = poll(rel, t * MS, [a, b])
        if acts.freeze:
            frozen_at = t
            assert acts.freeze == [0]
    assert frozen_at == 4 and rel.frozen == [0]        # lead 4 ms > 3 ms: co-stop a (never b)
    b.picked(), b.runs(MS)                             # b gets the CPU a left
    acts = poll(rel, 5 * MS, [a, b])
    assert acts.thaw == [] and rel.frozen == [0]       # lead 3 ms: not yet within 2 ms
    b.runs(MS)
    acts = poll(rel, 6 * MS, [a, b])
    assert acts.thaw == [0] and rel.frozen == []       # lead 2 ms: co-start


def test_relaxed_credits_a_laggard_the_runs_no_poll_saw():
    """A laggard seen queued at every poll that still ran in between (the
    switcher's wake-up preempts a vCPU on its CPU) catches up by what it ran."""
    a, b = Thread(0), Thread(1)
    rel = RelaxedRules(2, costop_ns=3 * MS, costart_ns=2 * MS)
    poll(rel, 0, [a, b])
    for t in range(1, 5):
        a.runs(MS)
        poll(rel, t * MS, [a, b])
    assert rel.frozen == [0]                           # lead 4 ms
    b.ran_unseen(MS // 2)
    assert poll(rel, 5 * MS, [a, b]).thaw == []        # 3.5 ms behind
    b.ran_unseen(MS)
    assert poll(rel, 6 * MS, [a, b]).thaw == []        # 2.5 ms behind
    b.ran_unseen(3 * MS)                               # no more than the poll's interval counts
    assert poll(rel, 7 * MS, [a, b]).thaw == [0]       # lead 1.5 ms: co-start


def test_relaxed_an_idle_vcpu_does_not_lag():
    a, b = Thread(0), Thread(1)
    rel = RelaxedRules(2, costop_ns=3 * MS, costart_ns=2 * MS)
    poll(rel, 0, [a, b])
    b.sleeps()
    for t in range(1, 50):
        a.runs(MS)
        assert poll(rel, t * MS, [a, b]).freeze == []
    b.waits()                                          # b wakes: it owes nothing
    a.runs(MS)
    assert poll(rel, 50 * MS, [a, b]).freeze == []


def test_relaxed_boosts_the_waiting_laggard_while_a_sibling_is_costopped():
    a, b = Thread(0), Thread(1)
    rel = RelaxedRules(2, costop_ns=3 * MS, costart_ns=2 * MS, boost_ns=2 * MS, pause_ns=2 * MS)
    poll(rel, 0, [a, b])
    boosts = []
    for t in range(1, 6):
        a.runs(MS)
        boosts += poll(rel, t * MS, [a, b]).boost
    assert rel.frozen == [0] and boosts == [1]
    assert RelaxedRules(2, 3 * MS, 2 * MS).boost_rules is None      # boost off: no boosts at all


def test_relaxed_counts_a_laggard_wait_it_could_not_boost():
    """A waiting laggard left unboosted for want of room is counted, as under ``boost``."""
    a, b = Thread(0), Thread(1)
    rel = RelaxedRules(2, costop_ns=3 * MS, costart_ns=2 * MS, boost_ns=2 * MS, pause_ns=2 * MS)
    poll(rel, 0, [a, b], room=0)
    held: dict[str, int] = {}
    for t in range(1, 6):
        a.runs(MS)
        acts = poll(rel, t * MS, [a, b], room=0)
        assert acts.boost == []
        for why, count in acts.held.items():
            held[why] = held.get(why, 0) + count
    assert rel.frozen == [0] and held == {"room": 1}


@settings(max_examples=300, deadline=None)
@given(n=st.integers(2, 4),
       script=st.lists(st.lists(st.sampled_from(["run", "wait", "pick", "sleep"]), min_size=4, max_size=4),
                       min_size=1, max_size=120),
       cpus=st.lists(st.integers(0, 1), min_size=4, max_size=4),
       room=st.integers(0, 3), pause=st.sampled_from([0, 2 * MS]))
def test_noisy_streams_never_freeze_every_vcpu_and_bound_boosts(n, script, cpus, room, pause):
    """Any stream: never all siblings co-stopped, never more boosts than the room,
    no boost outlives boost-ms by more than one poll, deadline boosts of
    a vCPU come a period apart at least, and its SCHED_FIFO boosts stay
    within their budget."""
    threads = [Thread(cpu=cpus[i]) for i in range(n)]
    rel = RelaxedRules(n, costop_ns=3 * MS, costart_ns=2 * MS, boost_ns=2 * MS, pause_ns=pause)
    bcs = BoostRules(n, boost_ns=2 * MS, pause_ns=pause)
    fifo = BoostRules(n, boost_ns=2 * MS, pause_ns=pause, period_ns=5 * MS, fifo=True, fifo_budget_ns=5 * MS)
    fifo_since: dict[int, int] = {}
    fifo_spent = [0] * n
    deadline_at: dict[int, int] = {}
    since: dict[tuple[str, int], int] = {}
    for t, moves in enumerate(script):
        for thread, move in zip(threads, moves):
            {"run": lambda: thread.runs(MS), "wait": thread.waits, "pick": thread.picked, "sleep": thread.sleeps}[move]()
        for name, rules in (("relaxed", rel), ("bcs", bcs), ("fifo", fifo)):
            acts = rules.step(t * MS, [x.seen() for x in threads], room)
            assert set(acts.fifo) <= set(acts.boost) and (name == "fifo" or not acts.fifo)
            for i in (set(acts.boost) - set(acts.fifo) if name == "fifo" else ()):
                assert t * MS - deadline_at.get(i, -5 * MS) >= 5 * MS      # a deadline boost a period apart
                deadline_at[i] = t * MS
            for i in (acts.unboost if name == "fifo" else ()):
                if i in fifo_since:
                    fifo_spent[i] += t * MS - fifo_since.pop(i)
            for i in (acts.fifo if name == "fifo" else ()):
                fifo_since[i] = t * MS
            # the script spans less than the budget's window
            assert all(fifo_spent[i] + (t * MS - fifo_since.get(i, t * MS)) <= 5 * MS for i in range(n))
            for i in acts.unboost:
                since.pop((name, i))
            for i in acts.boost:
                since[(name, i)] = t
            assert len(acts.boost) <= room and not set(acts.boost) & set(acts.unboost)
            assert all(t - s <= 2 for (who, _), s in since.items() if who == name)
        assert len(rel.frozen) < n


STATUS = b"""Name:\tCPU 1/TCG
State:\tR (running)
Tgid:\t4242
Pid:\t4250
Cpus_allowed_list:\t0-1
Mems_allowed_list:\t0
voluntary_ctxt_switches:\t17
nonvoluntary_ctxt_switches:\t215
"""


def test_switch_outs_from_status():
    assert switch_outs(STATUS) == 232


def test_one_field_of_status():
    text = STATUS.decode()
    assert status_field(text, "Tgid") == "4242" and status_field(text, "Cpus_allowed_list") == "0-1"
    assert status_field(text, "Pid") == "4250" and status_field(text, "Cpus") is None
    assert status_field(None, "Tgid") is None
    with pytest.raises(ValueError):
        switch_outs(STATUS[:STATUS.index(b"nonvoluntary")])          # cut short: no guess
