"""Parsing tracefs text into scheduler events (benchmarks.trace)."""
import pytest

from benchmarks.stats import (FROZEN, RUNNABLE, RUNNING, SLEEPING, frozen_at, reconstructed, states_at, timelines,
                              trace_figures, window_skews)
from benchmarks.trace import parse, setattr_calls

# Two vCPU threads of one guest, 11 and 12, with names that hold spaces.
TRACE = """\
# tracer: nop
#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION
       CPU 0/TCG-11      [000] d..2.   100.000000: sched_switch: prev_comm=CPU 0/TCG prev_pid=11 prev_prio=120 prev_state=R+ ==> next_comm=CPU 1/TCG next_pid=12 next_prio=120
       CPU 1/TCG-12      [000] d..2.   100.004000: sched_switch: prev_comm=CPU 1/TCG prev_pid=12 prev_prio=120 prev_state=S ==> next_comm=CPU 0/TCG next_pid=11 next_prio=120
       CPU 0/TCG-11      [000] d..2.   100.006000: sched_switch: prev_comm=CPU 0/TCG prev_pid=11 prev_prio=120 prev_state=S ==> next_comm=swapper/0 next_pid=0 next_prio=120
          <idle>-0       [001] dNh2.   100.007000: sched_wakeup: comm=CPU 1/TCG pid=12 prio=120 target_cpu=001
       CPU 1/TCG-12      [001] d..3.   100.009000: sched_wakeup: comm=CPU 0/TCG pid=11 prio=120 target_cpu=000
       CPU 1/TCG-12      [001] d..2.   100.010000: sched_switch: prev_comm=CPU 1/TCG prev_pid=12 prev_prio=120 prev_state=R ==> next_comm=qemu-system-x86 next_pid=5 next_prio=120
"""


def test_switches_and_wakeups_become_events():
    ev = parse(TRACE, {11, 12})
    kinds = [(e.t, e.tid, e.kind) for e in ev]
    assert (100.0, 11, "out-runnable") in kinds            # R+ : preempted, still runnable
    assert (100.0, 12, "in") in kinds
    assert (100.004, 12, "out-sleep") in kinds
    assert (100.009, 11, "wakeup") in kinds
    assert (100.01, 12, "out-runnable") in kinds           # R : runnable too


def test_a_switch_in_from_idle_the_kernel_dropped_is_recovered():
    # 12 is woken on idle CPU 1 at .007 and next seen current there at .009
    # without a switch-in: it went in at the earliest possible time, .007
    ev = parse(TRACE, {11, 12})
    assert [e.t for e in ev if e.tid == 12 and e.kind == "in"] == [100.0, 100.007]


BUSY_HIDDEN = """\
       CPU 1/TCG-12      [000] d..2.     2.000000: sched_switch: prev_comm=CPU 1/TCG prev_pid=12 prev_prio=120 prev_state=R ==> next_comm=tokio-rt-worker next_pid=75 next_prio=110
       CPU 1/TCG-12      [000] d.h1.     2.600000: sched_stat_runtime: comm=CPU 1/TCG pid=12 runtime=2000000 [ns]
       CPU 1/TCG-12      [000] d..2.     2.600010: sched_switch: prev_comm=CPU 1/TCG prev_pid=12 prev_prio=120 prev_state=R ==> next_comm=kworker/0:1 next_pid=5 next_prio=120
"""


def test_a_hidden_switch_in_from_a_busy_task_starts_where_the_threads_first_tick_says():
    # 12 waits from 2.0; the switch from the host task back to it never reached
    # the trace; its first tick, at 2.6, bills 2 ms since it went in: in at 2.598
    ev = parse(BUSY_HIDDEN, {12})
    assert [(pytest.approx(e.t), e.kind) for e in ev] == [(2.0, "in"), (2.0, "out-runnable"), (2.598, "in"),
                                                         (2.6, "tick"), (2.60001, "out-runnable")]
    f = trace_figures(timelines(ev, {12: RUNNING}, 2.0, 2.61))
    assert abs(f["run"][12] - 0.00201) < 1e-9 and abs(f["wait"][12] - 0.60799) < 1e-9, f


IDLE_WAKE = """\
          <idle>-0       [000] dNh2.     1.000000: sched_wakeup: comm=CPU 0/TCG pid=11 prio=120 target_cpu=000
          <idle>-0       [000] d..2.     1.000013: sched_switch: prev_comm=swapper/0 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=CPU 0/TCG next_pid=11 next_prio=120
          <idle>-0       [000] dNh2.     1.001000: sched_wakeup: comm=CPU 1/TCG pid=12 prio=120 target_cpu=001
       CPU 0/TCG-11      [000] d..2.     1.002000: sched_switch: prev_comm=CPU 0/TCG prev_pid=11 prev_prio=120 prev_state=S ==> next_comm=swapper/0 next_pid=0 next_prio=120
          <idle>-0       [000] dNh2.     1.003000: sched_wakeup: comm=CPU 0/TCG pid=11 prio=120 target_cpu=000
          <idle>-0       [000] d..2.     1.003010: sched_switch: prev_comm=swapper/0 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=kworker/0:1 next_pid=5 next_prio=120
     kworker/0:1-5       [000] d..2.     1.004000: sched_switch: prev_comm=kworker/0:1 prev_pid=5 prev_prio=120 prev_state=S ==> next_comm=CPU 0/TCG next_pid=11 next_prio=120
"""


def test_a_thread_woken_by_its_idle_cpu_runs_from_the_wake_up_unless_another_task_goes_first():
    # 11 woken by idle CPU 0 at 1.000, switched in 13 us later: running from 1.000;
    # 12 woken by CPU 0's idle task for CPU 1: it waits for CPU 1 (never switched in here);
    # 11 woken by idle CPU 0 again at 1.003, but a kworker gets the CPU first: waits from 1.00301 to 1.004
    ev = parse(IDLE_WAKE, {11, 12})
    assert [(e.t, e.kind) for e in ev if e.tid == 11 and e.kind != "wakeup"] == [
        (1.0, "in"), (1.000013, "in"), (1.002, "out-sleep"), (1.003, "in"), (1.00301, "out-runnable"), (1.004, "in")]
    assert [e.kind for e in ev if e.tid == 12] == ["wakeup"]
    start = states_at(ev, {11, 12}, 1.0)
    f = trace_figures(timelines(ev, start, 1.0, 1.005))
    assert abs(f["run"][11] - 0.00301) < 1e-9 and abs(f["wait"][11] - 0.00099) < 1e-9, f
    assert abs(f["wait"][12] - 0.004) < 1e-9, f


def test_other_threads_are_ignored():
    both = parse(TRACE, {11, 12})
    assert {e.tid for e in both} == {11, 12}
    only = parse(TRACE, {11})
    assert only and only == [e for e in both if e.tid == 11]


def test_exact_figures_of_the_parsed_trace():
    ev = parse(TRACE, {11, 12})
    start = states_at(ev, {11, 12}, 100.0)
    assert start == {11: RUNNABLE, 12: RUNNING}
    f = trace_figures(timelines(ev, start, 100.0, 100.010))
    # 0-4 ms: 12 runs, 11 waits (hazard); 4-6: 11 runs, 12 sleeps; 6-7: both asleep;
    # 7-9: 12 runs, 11 asleep; 9-10: 12 runs, 11 woken and waiting (hazard)
    assert abs(f["hazard"] - 0.005) < 1e-9
    assert abs(f["run"][12] - 0.007) < 1e-9 and abs(f["wait"][11] - 0.005) < 1e-9


def test_a_silent_thread_keeps_the_state_proc_reported():
    assert states_at([], {7}, 1.0) == {7: SLEEPING}
    assert states_at([], {7}, 1.0, silent={7: RUNNABLE}) == {7: RUNNABLE}


# 21 and 22 are vCPUs of a guest cosched co-stops one at a time; 23 is another guest's.
COSTOP = """\
       CPU 0/TCG-21      [000] d.h1.   200.000000: sched_stat_runtime: comm=CPU 0/TCG pid=21 runtime=4000000 [ns]
       CPU 1/TCG-22      [001] d.h1.   200.000000: sched_stat_runtime: comm=CPU 1/TCG pid=22 runtime=4000000 [ns]
         python3-99      [000] .....   200.001000: cgroup_freeze: root=0 id=71 level=3 path=/machine/qemu-3-g.libvirt-qemu/vcpu0
       CPU 0/TCG-21      [000] d..2.   200.001100: sched_switch: prev_comm=CPU 0/TCG prev_pid=21 prev_prio=120 prev_state=S ==> next_comm=swapper/0 next_pid=0 next_prio=120
         python3-99      [001] d..1.   200.002000: sched_stat_runtime: comm=CPU 1/TCG pid=22 runtime=12000 [ns]
       CPU 1/TCG-22      [001] d.h1.   200.004000: sched_stat_runtime: comm=CPU 1/TCG pid=22 runtime=4000000 [ns]
         python3-99      [000] .....   200.005000: cgroup_unfreeze: root=0 id=71 level=3 path=/machine/qemu-3-g.libvirt-qemu/vcpu0
         python3-99      [000] .....   200.005500: cgroup_freeze: root=0 id=70 level=2 path=/machine/qemu-4-h.libvirt-qemu
         python3-99      [000] d..3.   200.006000: sched_wakeup: comm=CPU 0/TCG pid=21 prio=120 target_cpu=000
          <idle>-0       [000] d..2.   200.007000: sched_switch: prev_comm=swapper/0 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=CPU 0/TCG next_pid=21 next_prio=120
"""
CGROUPS = {21: "/machine/qemu-3-g.libvirt-qemu/vcpu0", 22: "/machine/qemu-3-g.libvirt-qemu/vcpu1",
           23: "/machine/qemu-4-h.libvirt-qemu/vcpu0"}


def test_ticks_freezes_and_thaws_become_events():
    ev = [(e.t, e.tid, e.kind) for e in parse(COSTOP, {21, 22, 23}, CGROUPS)]
    assert (200.0, 21, "tick") in ev and (200.004, 22, "tick") in ev
    assert (200.002, 22, "tick") not in ev                 # raised by python3 reading 22's run time
    assert (200.001, 21, "freeze") in ev and (200.005, 21, "thaw") in ev
    assert (200.0055, 23, "freeze") in ev                  # an ancestor of 23's cgroup froze
    assert not [e for e in ev if e[1] == 22 and e[2] in ("freeze", "thaw")]


def test_a_co_stopped_vcpu_is_frozen_not_asleep_and_lags():
    ev = parse(COSTOP, {21, 22}, CGROUPS)
    t0, t1 = 200.0, 200.010
    lines = timelines(ev, states_at(ev, {21, 22}, t0), t0, t1, frozen_at(ev, {21, 22}, t0))
    # 21: runs 0-1.1 ms (still running after the freeze write), frozen 1.1-5, asleep 5-6,
    # waiting 6-7, running 7-10; 22 runs throughout
    assert [(round(b - t0, 4), round(e - t0, 4), s) for b, e, s in lines[21]] == [
        (0.0, 0.0011, RUNNING), (0.0011, 0.005, FROZEN), (0.005, 0.006, SLEEPING),
        (0.006, 0.007, RUNNABLE), (0.007, 0.01, RUNNING)]
    assert lines[22] == [(t0, t1, RUNNING)]
    # lag is wait + frozen: 3.9 ms in the first 5 ms window; in the second 1 ms waiting, the ms asleep is not lag
    assert window_skews(lines, t0, t1, 0.005) == [pytest.approx(0.0039), pytest.approx(0.001)]
    assert trace_figures(lines)["hazard"] == pytest.approx(0.001)     # frozen is not waiting


def test_frozen_before_the_trace_is_implied_by_a_thaw():
    ev = parse(COSTOP, {21}, CGROUPS)
    assert frozen_at(ev, {21}, 200.003) == {21: True}
    assert frozen_at(ev, {21}, 200.0005) == {21: False}
    assert frozen_at([e for e in ev if e.kind != "freeze"], {21}, 200.0) == {21: True}


def test_reconstructed_time_is_what_no_event_showed():
    ev = parse(COSTOP, {21, 22}, CGROUPS)
    # from 200.0005: both seen running before; from 199.999: nothing seen until the first ticks
    assert reconstructed(ev, {21, 22}, 200.0005, 200.010) == {21: 0.0, 22: 0.0}
    assert reconstructed(ev, {21, 22}, 199.999, 200.010) == {21: pytest.approx(0.001), 22: pytest.approx(0.001)}
    # a freeze or thaw says nothing about the thread's state: 21's first state event after 200.0015 ...
    late = [e for e in ev if e.t > 200.0015]
    assert reconstructed(late, {21}, 200.0015, 200.010) == {21: pytest.approx(0.0045)}   # ... is the wake-up
    assert reconstructed([], {7}, 1.0, 3.0) == {7: 2.0}


def test_setattr_calls_are_paired_with_their_result_by_caller():
    text = """\
    python3-700     [001] .....   50.000100: sys_sched_setattr(pid: 0xb, uattr: 0x7f163045b0f0, flags: 0)
    python3-701     [000] .....   50.000110: sys_sched_setattr(pid: 0xc, uattr: 0x7f163045b430, flags: 0)
    python3-700     [001] .....   50.000120: sys_sched_setattr -> 0x0
    python3-701     [000] .....   50.000130: sys_sched_setattr -> 0xfffffffffffffff0
    python3-700     [001] .....   50.000200: sys_sched_setattr(pid: 0xb, uattr: 0x7f163045b0f0, flags: 0)
"""
    # 701's call on 12 failed (EBUSY); 700's second call has no exit in the trace yet
    assert setattr_calls(text) == [(50.0001, 11, True, False), (50.00011, 12, False, False)]
    assert setattr_calls(TRACE) == []


def test_a_call_is_a_boost_when_the_thread_next_shows_a_realtime_or_deadline_priority():
    text = """\
    python3-700     [001] .....   50.000100: sys_sched_setattr(pid: 0xb, uattr: 0x7f163045b0f0, flags: 0)
    python3-700     [001] .....   50.000120: sys_sched_setattr -> 0x0
       CPU 1/TCG-12      [000] d..2.   50.000150: sched_switch: prev_comm=CPU 1/TCG prev_pid=12 prev_prio=120 prev_state=R+ ==> next_comm=CPU 0/TCG next_pid=11 next_prio=-1
    python3-700     [001] .....   50.002000: sys_sched_setattr(pid: 0xb, uattr: 0x7f163045b0f0, flags: 0)
    python3-700     [001] .....   50.002020: sys_sched_setattr -> 0x0
    python3-700     [001] .....   50.003000: sys_sched_setattr(pid: 0xc, uattr: 0x7f163045b0f0, flags: 0)
    python3-700     [001] .....   50.003020: sys_sched_setattr -> 0x0
       CPU 0/TCG-11      [000] d..2.   50.004000: sched_switch: prev_comm=CPU 0/TCG prev_pid=11 prev_prio=120 prev_state=S ==> next_comm=CPU 1/TCG next_pid=12 next_prio=98
    python3-700     [001] .....   50.005000: sys_sched_setattr(pid: 0xc, uattr: 0x7f163045b0f0, flags: 0)
    python3-700     [001] .....   50.005020: sys_sched_setattr -> 0x0
         <idle>-0       [001] dNh2.   50.006000: sched_wakeup: comm=CPU 1/TCG pid=12 prio=120 target_cpu=001
"""
    # 11: a deadline boost (-1 when next switched in), then its return (120 when it next leaves);
    # 12: a SCHED_FIFO boost (98), then its return (120 at its wake-up)
    assert [(tid, raised) for _, tid, _, raised in setattr_calls(text)] == [(11, True), (11, False), (12, True),
                                                                              (12, False)]
