import pytest

from cosched.discovery import build_snapshot
from cosched.discovery.libvirt import DomainFacts
from cosched.policy.presets import Presets
from cosched.sampler import Sampler
from cosched.histogram import Histogram
from cosched.sampler.estimate import VcpuCarry, estimate, hazard_bounds, place

MS = 1e-3
UUID = "11111111-2222-3333-4444-555555555555"


def test_all_running_or_all_waiting_has_no_hazard():
    assert estimate(10 * MS, [(10 * MS, 0), (10 * MS, 0)]).hazard == 0
    w = estimate(10 * MS, [(0, 10 * MS), (0, 10 * MS)])
    assert w.hazard == 0 and w.partial == pytest.approx(10 * MS)


def test_one_runs_one_waits_is_all_hazard():
    w = estimate(10 * MS, [(10 * MS, 0), (0, 10 * MS)])
    assert w.hazard == pytest.approx(10 * MS)
    assert w.partial == 0
    assert w.skew == pytest.approx(10 * MS)


def test_one_runs_one_idle_is_neither():
    w = estimate(10 * MS, [(10 * MS, 0), (0, 0)])
    assert (w.hazard, w.partial, w.skew) == (0, 0, 0)


def test_single_vcpu_has_no_hazard_but_partial():
    w = estimate(10 * MS, [(4 * MS, 6 * MS)])
    assert w.hazard == 0 and w.partial == pytest.approx(6 * MS)


def test_independence_estimate_for_halves():
    # each vCPU runs half and waits half: P(some run & some wait) = 1 - .25 - .25 + 0
    w = estimate(10 * MS, [(5 * MS, 5 * MS), (5 * MS, 5 * MS)])
    assert w.hazard == pytest.approx(5 * MS)
    assert w.partial == pytest.approx(2.5 * MS)


@pytest.mark.parametrize("placed,cpus,truth", [
    ([(10 * MS, 0), (0, 10 * MS)], None, 10 * MS),          # one ran throughout while the other waited
    ([(10 * MS, 0), (10 * MS, 0)], None, 0.0),              # both ran throughout
    ([(0, 10 * MS), (0, 10 * MS)], None, 0.0),              # both waited: nobody ran
    ([(0, 0), (10 * MS, 0)], None, 0.0),                    # one idled, one ran
    ([(10 * MS, 0), (0, 10 * MS), (0, 0)], None, 10 * MS),
    ([(5 * MS, 5 * MS), (5 * MS, 5 * MS)], [0, 0], 10 * MS),  # queued on one CPU: they take turns
])
def test_estimate_equals_the_truth_where_the_window_determines_it(placed, cpus, truth):
    assert estimate(10 * MS, placed, cpus=cpus).hazard == pytest.approx(truth, abs=1e-12)


def test_independence_is_the_model_where_the_window_does_not_determine_it():
    # two vCPUs on distinct CPUs, each half running, half waiting: the truth lies
    # anywhere in [0, 10] ms; independence says run1*wait2 + run2*wait1 = 5 ms
    placed = [(5 * MS, 5 * MS), (5 * MS, 5 * MS)]
    assert hazard_bounds(10 * MS, placed) == pytest.approx((0.0, 10 * MS))
    assert estimate(10 * MS, placed).hazard == pytest.approx(5 * MS)


def test_costop_counts_as_lag():
    assert estimate(10 * MS, [(10 * MS, 0), (0, 0)], costop=[0, 10 * MS]).skew == pytest.approx(10 * MS)


def test_late_credit_is_carried_not_lost():
    carry = VcpuCarry()
    # the kernel credits 25 ms of wait at once when a long wait ends
    assert place(carry, 0, 25 * MS, 10 * MS) == (0, pytest.approx(10 * MS))
    assert place(carry, 0, 0, 10 * MS) == (0, pytest.approx(10 * MS))
    assert place(carry, 0, 0, 10 * MS) == (0, pytest.approx(5 * MS))
    assert place(carry, 0, 0, 10 * MS) == (0, 0)


def test_uncredited_wait_is_placed_at_once_and_paid_off_by_the_credit():
    carry = VcpuCarry()
    # runnable at both ends of two windows, no run: two windows of wait, in advance
    assert place(carry, 0, 0, 10 * MS, waiting=True) == (0, pytest.approx(10 * MS))
    assert place(carry, 0, 0, 10 * MS, waiting=True) == (0, pytest.approx(10 * MS))
    assert carry.advance == pytest.approx(20 * MS)
    # the wait ends: the kernel credits 23 ms; 20 were placed already, 3 belong here
    r, w = place(carry, 5 * MS, 23 * MS, 10 * MS)
    assert (r, w) == (pytest.approx(5 * MS), pytest.approx(3 * MS))
    assert carry.advance == 0 and carry.wait == pytest.approx(0)


def test_runnable_thread_that_ran_is_not_taken_for_waiting():
    carry = VcpuCarry()
    assert place(carry, 6 * MS, 0, 10 * MS, waiting=True) == (pytest.approx(6 * MS), 0)
    assert carry.advance == 0


def test_run_time_credited_late_drops_the_wait_it_was_taken_for():
    """On a tickless CPU a lone running thread's run time is credited late: it
    looks queued. When the run credit comes without a wait credit, the
    advance was no wait and is not kept as one."""
    carry = VcpuCarry()
    assert place(carry, 0, 0, 10 * MS, waiting=True) == (0, pytest.approx(10 * MS))
    assert place(carry, 0, 0, 10 * MS, waiting=True) == (0, pytest.approx(10 * MS))
    place(carry, 30 * MS, 0, 10 * MS, waiting=True)
    assert carry.advance == 0


def test_siblings_on_one_cpu_alternate_so_one_always_waits():
    halves = [(5 * MS, 5 * MS), (5 * MS, 5 * MS)]
    assert estimate(10 * MS, halves, cpus=[0, 0]).hazard == pytest.approx(10 * MS)
    assert estimate(10 * MS, halves, cpus=[0, 1]).hazard == pytest.approx(5 * MS)   # independent
    # mostly waiting on one CPU: hazard is the time either runs, the rest is partial contention
    w = estimate(10 * MS, [(1.7 * MS, 8.3 * MS), (1.7 * MS, 8.3 * MS)], cpus=[1, 1])
    assert w.hazard == pytest.approx(3.4 * MS) and w.partial == pytest.approx(6.6 * MS)


def test_a_group_of_one_is_the_independent_estimate():
    placed = [(2 * MS, 3 * MS), (7 * MS, 1 * MS), (0, 10 * MS)]
    a, b = estimate(10 * MS, placed), estimate(10 * MS, placed, cpus=[0, 1, None])
    assert (a.hazard, a.partial) == pytest.approx((b.hazard, b.partial))


def test_idle_sibling_on_the_same_cpu_adds_no_hazard():
    w = estimate(10 * MS, [(10 * MS, 0), (0, 0)], cpus=[0, 0])
    assert (w.hazard, w.partial) == (0, 0)


def test_run_placed_before_wait_and_window_never_overfull():
    carry = VcpuCarry()
    r, w = place(carry, 8 * MS, 8 * MS, 10 * MS)
    assert (r, w) == (pytest.approx(8 * MS), pytest.approx(2 * MS))
    assert carry.wait == pytest.approx(6 * MS)


def test_histogram_buckets_are_cumulative():
    h = Histogram((0.001, 0.01))
    for v in (0.0005, 0.002, 0.003, 0.5):
        h.observe(v)
    assert h.buckets() == [("0.001", 1), ("0.01", 3), ("+Inf", 4)]
    assert h.total == pytest.approx(0.5055)


def make_snapshot(fake, fs, vcpus):
    fake.qemu(100, "vm1", UUID, vcpus)
    return build_snapshot(fs, [DomainFacts("vm1", UUID, "<domain/>")], Presets.load([]), "none")


def test_sampler_accumulates_from_schedstat(fake, fs):
    snap = make_snapshot(fake, fs, {0: 101, 1: 102})
    s = Sampler(fs, 0.01, lambda: snap)
    s.step(now_ns=0)
    # in 10 ms vCPU 0 ran the whole window, vCPU 1 waited the whole window
    fake.schedstat(100, 101, 10_000_000, 0)
    fake.schedstat(100, 102, 0, 10_000_000)
    s.step(now_ns=10_000_000)
    (view,) = s.view().values()
    assert view.name == "vm1" and view.observed == pytest.approx(0.01)
    assert view.hazard == pytest.approx(0.01)
    assert [(v.run, v.wait) for v in view.vcpus] == [(0.01, 0.0), (0.0, 0.01)]
    assert view.skew_count == 1 and view.skew_sum == pytest.approx(0.01)


def test_sampler_sees_a_wait_schedstat_has_not_credited(fake, fs):
    snap = make_snapshot(fake, fs, {0: 101, 1: 102})
    fake.stat(100, 102, "CPU 1/TCG", state="R", cpu=1)
    s = Sampler(fs, 0.01, lambda: snap)
    s.step(now_ns=0)
    # vCPU 0 ran the window; vCPU 1 stayed queued (R) without running: no credit yet
    fake.schedstat(100, 101, 10_000_000, 0)
    fake.stat(100, 101, "CPU 0/TCG", state="R", cpu=0)
    s.step(now_ns=10_000_000)
    view = s.view()[UUID]
    assert view.hazard == pytest.approx(0.01)
    assert (view.vcpus[1].wait, view.vcpus[1].waiting) == (0.0, pytest.approx(0.01))   # not credited yet


def test_a_starved_vcpus_wait_counts_as_it_happens_and_once(fake, fs):
    """A vCPU the host leaves queued for a second: its wait in progress grows
    window by window (``auto`` must not read it as idle), and the kernel's
    credit, when the wait ends, takes its place."""
    snap = make_snapshot(fake, fs, {0: 101, 1: 102})
    fake.stat(100, 102, "CPU 1/TCG", state="R", cpu=1)
    s = Sampler(fs, 0.01, lambda: snap)
    s.step(now_ns=0)
    for k in range(1, 101):
        fake.schedstat(100, 101, k * 10_000_000, 0)
        s.step(now_ns=k * 10_000_000)
        v = s.view()[UUID].vcpus[1]
        assert (v.wait, v.waiting) == (0.0, pytest.approx(k * 0.01))
    fake.schedstat(100, 102, 1_000_000, 1_000_000_000)  # it ran at last: the kernel credits the whole second
    s.step(now_ns=1_010_000_000)
    assert [(v.wait, v.waiting) for v in s.view()[UUID].vcpus] == [(0.0, 0.0), (pytest.approx(1.0), 0.0)]


@pytest.mark.parametrize("kernel_counts", [True, False])
def test_costop_counts_in_the_window_it_happened(fake, fs, kernel_counts):
    """vCPU 1 is co-stopped through the first window while vCPU 0 runs; the
    engine hears of it only in the second (the switcher reports ten times a
    second). Where the kernel counts the cgroup's frozen time, the sampler
    reads it and the lag falls in the first window; before 6.17 it falls
    where the engine's count arrives."""
    snap = make_snapshot(fake, fs, {0: 101, 1: 102})
    vcpu1 = f"{fake.cg2}/machine/qemu-1-vm1.libvirt-qemu/vcpu1"
    if kernel_counts:
        fake.write(f"{fake.cg2}/machine/qemu-1-vm1.libvirt-qemu/vcpu0/cgroup.stat.local", "frozen_usec 0\n")
        fake.write(f"{vcpu1}/cgroup.stat.local", "frozen_usec 5000000\n")    # frozen before: not this window's
    engine = {}
    s = Sampler(fs, 0.01, lambda: snap, costop=lambda: dict(engine))
    s.step(now_ns=0)
    fake.schedstat(100, 101, 10_000_000, 0)
    if kernel_counts:
        fake.write(f"{vcpu1}/cgroup.stat.local", "frozen_usec 5010000\n")
    s.step(now_ns=10_000_000)
    engine[(UUID, 1)] = 0.01                          # the switcher's report arrives
    fake.schedstat(100, 101, 20_000_000, 0)
    fake.schedstat(100, 102, 10_000_000, 0)
    s.step(now_ns=20_000_000)
    dom = s.domains[UUID]
    assert (dom.vcpus[1].frozen_fd is not None) == kernel_counts
    skews = [dom.skew.total, dom.last_skew]           # both windows, the last one
    assert skews == ([pytest.approx(0.01), 0.0] if kernel_counts else [pytest.approx(0.01), pytest.approx(0.01)])


def test_a_thread_gone_requests_resync(fake, fs):
    snap = make_snapshot(fake, fs, {0: 101, 1: 102})
    asked = []
    s = Sampler(fs, 0.01, lambda: snap, on_gone=lambda: asked.append(1))
    s.step(now_ns=0)
    # the fake cannot make an open descriptor fail, so swap in a closed one
    import os
    dom = next(iter(s.domains.values()))
    os.close(dom.vcpus[1].fd)
    dom.vcpus[1].fd = os.open("/dev/null", os.O_RDONLY)   # reads b"": unparsable
    s.step(now_ns=10_000_000)
    assert asked == [1]
    assert [v.index for v in s.view()[UUID].vcpus] == [0]


def test_vcpus_past_the_open_files_limit_go_unsampled_and_it_is_said_once(fake, fs, caplog, monkeypatch):
    """A descriptor refused for want of room (EMFILE) leaves its vCPU
    unsampled, tried again with each new snapshot, with one error in the
    log until an open succeeds; the vCPUs it could open are sampled
    meanwhile."""
    import errno
    current = [make_snapshot(fake, fs, {0: 101, 1: 102})]
    real, full = fs.open_fd, [True]

    def open_fd(path):
        if full[0] and "/102/" in path:
            raise OSError(errno.EMFILE, "Too many open files")
        return real(path)
    monkeypatch.setattr(fs, "open_fd", open_fd)
    s = Sampler(fs, 0.01, lambda: current[0])
    with caplog.at_level("ERROR", logger="cosched.sampler"):
        for i in range(3):
            current[0] = make_snapshot(fake, fs, {0: 101, 1: 102})
            s.step(now_ns=i * 10_000_000)
    assert [v.index for v in s.view()[UUID].vcpus] == [0]
    said = [r.getMessage() for r in caplog.records if "action=vcpu-unsampled" in r.getMessage()]
    assert len(said) == 1 and "tid=102" in said[0] and "open files limit" in said[0], said
    full[0] = False
    current[0] = make_snapshot(fake, fs, {0: 101, 1: 102})
    s.step(now_ns=30_000_000)
    assert [v.index for v in s.view()[UUID].vcpus] == [0, 1] and not s.out_of_files


def test_sampler_follows_snapshot_changes(fake, fs):
    snap = make_snapshot(fake, fs, {0: 101})
    current = [snap]
    s = Sampler(fs, 0.01, lambda: current[0])
    s.step(now_ns=0)
    assert UUID in s.view()
    current[0] = build_snapshot(fs, [], Presets.load([]), "none")
    s.step(now_ns=10_000_000)
    assert s.view() == {}


def test_sampling_stretches_its_period_to_stay_within_its_cpu_budget(fs):
    from cosched.sampler import Sampler
    s = Sampler(fs, 0.010, lambda: None, budget=0.02)
    assert s.stretch(0.0001) == pytest.approx(0.010)          # 0.1 ms a pass at 10 ms: 1%, within 2%
    for _ in range(60):
        period = s.stretch(0.004)                             # 4 ms a pass (hundreds of vCPUs)
    assert period == pytest.approx(0.2, rel=0.05)             # 4 ms per 200 ms: 2%
    for _ in range(60):
        period = s.stretch(0.0001)
    assert period == pytest.approx(0.010)                     # back once passes are cheap again


def test_the_rest_of_the_daemon_comes_off_the_budget_down_to_half_of_it(fs):
    from cosched.sampler import Sampler
    s = Sampler(fs, 0.010, lambda: None, budget=0.02)
    for _ in range(60):                                       # 30 min of passes: the averages settled
        period = s.stretch(0.004, rest=0.005, elapsed=30.0)   # resyncs and scrapes take 0.5% of a CPU
    assert period == pytest.approx(0.004 / 0.015, rel=0.01)   # sampling 1.5% + the rest 0.5% = 2%
    for _ in range(60):
        period = s.stretch(0.004, rest=0.05, elapsed=30.0)    # the rest alone over budget
    assert period == pytest.approx(0.004 / 0.01, rel=0.01)    # sampling keeps half: 1%
    for _ in range(60):
        period = s.stretch(0.004, rest=0.0, elapsed=30.0)
    assert period == pytest.approx(0.2, rel=0.01)


class FakeMeter:
    """The meter's interface (:class:`cosched.sampler.meter.Meter`) with
    totals the test sets: ``threads[tid] = (state, run, wait, frozen)``,
    ``guests[number] = (hazard, partial)``, seconds since the guest was added."""

    def __init__(self):
        self.members, self.threads, self.guests, self.added, self.fail, self.closed = {}, {}, {}, [], None, False

    def add(self, guest, states):
        self.added.append((guest, tuple(states)))
        self.states = dict(states)
        self.guests[guest] = (0.0, 0.0)
        for tid in states:
            self.members[tid] = guest
            self.threads[tid] = (0, 0.0, 0.0, 0.0)

    def remove(self, guest):
        self.guests.pop(guest)
        for tid in [t for t, g in self.members.items() if g == guest]:
            del self.members[tid], self.threads[tid]

    def read(self):
        from cosched.sampler.meter import GuestTimes, Reading, ThreadTimes
        if self.fail:
            raise self.fail
        return Reading({tid: ThreadTimes(self.members[tid], *t) for tid, t in self.threads.items()},
                       {g: GuestTimes(*v) for g, v in self.guests.items()})

    def close(self):
        self.closed = True


def test_metered_figures_are_the_meters_exact_totals_and_proc_is_read_once(fake, fs):
    from cosched.sampler.meter import RUNNING, WAITING
    snap = make_snapshot(fake, fs, {0: 101, 1: 102})
    fake.schedstat(100, 101, 5_000_000_000, 1_000_000_000)      # what the kernel credited before the meter began
    meter = FakeMeter()
    s = Sampler(fs, 0.01, lambda: snap, meter=meter)
    s.step(now_ns=0)
    assert s.source == "meter" and meter.added == [(1, (101, 102))]
    fake.schedstat(100, 101, 0, 0)              # never read again: nonsense here changes nothing
    meter.threads = {101: (RUNNING, 0.008, 0.0, 0.0), 102: (WAITING, 0.002, 0.006, 0.001)}
    meter.guests[1] = (0.006, 0.001)
    s.step(now_ns=10_000_000)
    view = s.view()[UUID]
    assert view.hazard == pytest.approx(0.006) and view.partial == pytest.approx(0.001)
    assert view.skew_sum == pytest.approx(0.007) and view.skew_count == 1       # lag: wait + frozen
    assert [(v.run, v.wait, v.waiting) for v in view.vcpus] == [
        (pytest.approx(5.008), pytest.approx(1.0), 0.0), (pytest.approx(0.002), pytest.approx(0.006), 0.0)]
    meter.threads[101] = (RUNNING, 0.018, 0.0, 0.0)                       # the next window: only deltas count
    meter.guests[1] = (0.009, 0.001)
    s.step(now_ns=20_000_000)
    view = s.view()[UUID]
    assert view.hazard == pytest.approx(0.009) and view.skew_sum == pytest.approx(0.007)


def test_a_thread_the_meter_saw_exit_requests_resync_and_a_new_one_restarts_the_guests_count(fake, fs):
    from cosched.sampler.meter import DEAD, SLEEPING
    snap = make_snapshot(fake, fs, {0: 101, 1: 102})
    asked, meter = [], FakeMeter()
    s = Sampler(fs, 0.01, lambda: current[0], on_gone=lambda: asked.append(1), meter=meter)
    current = [snap]
    s.step(now_ns=0)
    meter.threads = {101: (SLEEPING, 0.5, 0.25, 0.0), 102: (DEAD, 0.1, 0.0, 0.0)}
    meter.guests[1] = (0.2, 0.0)
    s.step(now_ns=10_000_000)
    assert asked == [1] and [v.index for v in s.view()[UUID].vcpus] == [0]
    import shutil
    shutil.rmtree(fake.root / "proc/100/task/102")
    current[0] = make_snapshot(fake, fs, {0: 101, 1: 103})            # vCPU 1 again, a new thread
    s.step(now_ns=20_000_000)
    assert meter.added == [(1, (101, 102)), (1, (101, 103))]
    meter.threads[101] = (SLEEPING, 0.125, 0.0, 0.0)                      # counted afresh from the re-add
    meter.guests[1] = (0.05, 0.0)
    s.step(now_ns=30_000_000)
    view = s.view()[UUID]
    assert view.vcpus[0].run == pytest.approx(0.625) and view.hazard == pytest.approx(0.25)


def test_a_failing_meter_gives_way_to_proc_sampling_and_says_so(fake, fs, caplog):
    snap = make_snapshot(fake, fs, {0: 101, 1: 102})
    meter = FakeMeter()
    s = Sampler(fs, 0.01, lambda: snap, meter=meter)
    s.step(now_ns=0)
    meter.fail = OSError(9, "meter: cannot read threads: Bad file descriptor")
    fake.schedstat(100, 101, 10_000_000, 0)
    fake.schedstat(100, 102, 0, 10_000_000)
    with caplog.at_level("ERROR", logger="cosched.sampler"):
        s.step(now_ns=10_000_000)
    assert s.source == "proc" and meter.closed and "Bad file descriptor" in s.meter_error
    assert "action=meter-off" in caplog.text
    view = s.view()[UUID]
    assert view.hazard == pytest.approx(0.01) and [(v.run, v.wait) for v in view.vcpus] == [(0.01, 0.0), (0.0, 0.01)]


def test_the_meter_starts_each_thread_in_the_state_proc_shows(fake, fs):
    """A vCPU alone on an isolated CPU may never be switched out: the meter
    must not wait for an event to know it runs."""
    from cosched.sampler.meter import RUNNING, SLEEPING, WAITING
    snap = make_snapshot(fake, fs, {0: 101, 1: 102, 2: 103})
    for tid, ins, outs in ((101, 5, 4), (102, 5, 5)):        # on a CPU: one switch-in more than out
        fake.stat(100, tid, "CPU/TCG", state="R")
        fake.write(f"/proc/100/task/{tid}/schedstat", f"1000 2000 {ins}\n")
        fake.write(f"/proc/100/task/{tid}/status",
                   f"Name:\tCPU\nvoluntary_ctxt_switches:\t{outs - 1}\nnonvoluntary_ctxt_switches:\t1\n")
    meter = FakeMeter()
    Sampler(fs, 0.01, lambda: snap, meter=meter).step(now_ns=0)
    assert meter.states == {101: RUNNING, 102: WAITING, 103: SLEEPING}


def test_a_full_meter_map_is_named_in_the_error_that_turns_the_meter_off():
    import ctypes
    import errno

    from cosched.sampler.meter import _Guest, _put

    class FullMap:
        def bpf_map_update_elem(self, fd, key, value, flags):
            ctypes.set_errno(errno.E2BIG)
            return -1

    with pytest.raises(OSError) as e:
        _put(FullMap(), 3, 7, _Guest(), "add guest 7")
    assert e.value.errno == errno.E2BIG and "add guest 7" in str(e.value) and "maps are full" in str(e.value)
