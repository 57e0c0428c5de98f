"""Parsing tracefs text into scheduler events (benchmarks.trace)."""
from benchmarks.stats import RUNNABLE, RUNNING, SLEEPING, states_at, timelines, trace_figures
from benchmarks.trace import parse

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
