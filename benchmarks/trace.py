"""Record the kernel's scheduler and cgroup-freeze events for chosen threads.

The metric-truth benchmark uses this to compute, exactly, what cosched
estimates from schedstat samples. It works through tracefs in a private
instance (``instances/cosched-bench``), so it neither needs ``perf`` nor
disturbs another user of the global trace buffer:

* tracefs is mounted at ``/sys/kernel/tracing`` when no tracefs is mounted
  (and unmounted again afterwards);
* the instance's clock is ``mono``, so event times are ``CLOCK_MONOTONIC``
  seconds, the clock of ``time.monotonic()``;
* events: ``sched_switch``, ``sched_wakeup``, ``sched_stat_runtime`` (run
  time accounted to the current task at every tick, so a thread that runs
  a whole interval without a switch is still seen running), and
  ``cgroup_freeze``/``cgroup_unfreeze`` (so a co-stopped vCPU is told from a
  sleeping one);
* ``sched_setattr`` calls aimed at the given threads (``syscalls``
  enter and exit, when asked for: ``calls=True``), so the benchmark sees
  when cosched boosted or unboosted a vCPU and whether the kernel took it;
* filters keep the given threads (``prev_pid``/``next_pid`` for
  switches, ``pid`` otherwise) and every switch to or from the idle task
  (which :func:`parse` needs), and the per-CPU buffer is large enough for
  tens of seconds of busy vCPUs; the overrun count is reported so a lossy
  trace is never taken for a true one.

Parsing (:func:`parse`) is pure and lives here too, next to the format it reads.
"""
from __future__ import annotations

import bisect
import os
import re
import subprocess
from pathlib import Path

from benchmarks.stats import Event

INSTANCE = "cosched-bench"
_LINE = re.compile(r"^\s*(.*?)-(\d+)\s+\[(\d+)\]\s+\S+\s+(\d+\.\d+): "
                   r"(sched_switch|sched_wakeup|sched_stat_runtime|cgroup_freeze|cgroup_unfreeze): (.*)$")
_SWITCH = re.compile(r"prev_pid=(\d+) prev_prio=-?\d+ prev_state=(\S+) ==> next_comm=(.*) next_pid=(\d+) next_prio=")
_WAKEUP = re.compile(r"(?:^|\s)pid=(\d+) prio=-?\d+(?: target_cpu=(\d+))?")
_PRIOS = re.compile(r"(?:^|\s)(?:prev_|next_)?pid=(\d+) (?:prev_|next_)?prio=(-?\d+)")
_RUNTIME = re.compile(r"(?:^|\s)pid=(\d+) runtime=(\d+)")
_CGROUP = re.compile(r"^root=0 id=\d+ level=\d+ path=(\S+)")      # root 0: the v2 hierarchy
_CALL = re.compile(r"^\s*(.*?)-(\d+)\s+\[\d+\]\s+\S+\s+(\d+\.\d+): sys_sched_setattr(?:\(pid: (0x[0-9a-f]+)| -> (0x[0-9a-f]+))")
SCHED_EVENTS = ("sched_switch", "sched_wakeup", "sched_stat_runtime")
CGROUP_EVENTS = ("cgroup_freeze", "cgroup_unfreeze")
CALL_EVENTS = ("sys_enter_sched_setattr", "sys_exit_sched_setattr")


def switches(text: str):
    """Every ``sched_switch`` in tracefs text, in order: ``(t, cpu, prev_pid,
    prev_state, next_pid, next_comm)``."""
    for line in text.splitlines():
        m = _LINE.match(line)
        if m and m.group(5) == "sched_switch":
            s = _SWITCH.search(m.group(6))
            if s:
                yield float(m.group(4)), int(m.group(3)), int(s.group(1)), s.group(2), int(s.group(4)), s.group(3)


def setattr_calls(text: str) -> list[tuple[float, int, bool, bool]]:
    """Every ``sched_setattr`` in tracefs text whose exit was seen:
    ``(t, target tid, succeeded, raised)``, ``t`` the time of the call.
    Enter and exit are paired by the calling thread (a thread makes one call
    at a time). ``raised``: the target's next switch or wake-up after the
    call shows it at a realtime or deadline priority (kernel prio below 100:
    a boost), not at a normal one (a return from a boost, or a boost ended
    before the thread was next seen); False where no later event shows it."""
    calls, open_calls, prios = [], {}, {}
    for line in text.splitlines():
        m = _CALL.match(line)
        if not m:
            e = _LINE.match(line)
            if e and e.group(5) in ("sched_switch", "sched_wakeup"):
                for tid, prio in _PRIOS.findall(e.group(6)):
                    prios.setdefault(int(tid), []).append((float(e.group(4)), int(prio)))
            continue
        caller, t = int(m.group(2)), float(m.group(3))
        if m.group(4) is not None:
            open_calls[caller] = (t, int(m.group(4), 16))
        elif caller in open_calls:
            t_call, tid = open_calls.pop(caller)
            calls.append((t_call, tid, int(m.group(5), 16) == 0, t))
    out = []
    for t_call, tid, ok, t_exit in calls:
        seen = prios.get(tid, [])
        k = bisect.bisect_right(seen, (t_exit, float("inf")))
        out.append((t_call, tid, ok, k < len(seen) and seen[k][1] < 100))
    return out


def parse(text: str, tids: set[int], cgroups: dict[int, str] | None = None) -> list[Event]:
    """Events of ``tids`` from tracefs text output (``trace_clock`` seconds).

    ``cgroups`` maps each thread to its v2 cgroup path (as in
    ``/proc/TID/cgroup``); freezing or thawing that cgroup or an ancestor
    becomes a ``freeze`` or ``thaw`` event of the thread when it changes
    whether the thread is frozen. ``sched_stat_runtime`` of a thread on its
    own CPU is a ``tick`` (it was running); one raised from another task
    (a remote read of its run time) says nothing and is skipped.

    A switch away from a thread whose ``prev_state`` is ``R`` or ``R+``
    (preempted) leaves it runnable; any other state (sleeping, halted,
    frozen) leaves it blocked.

    Some switches never reach the trace: on this host, most of those from a
    CPU's idle task (8 switch-ins against 227 switch-outs of a thread that
    sleeps 5 ms at a time), and now and then one from a busy task (a vCPU
    waiting 0.6 s was switched in by a host task with no ``sched_switch``,
    while the kernel billed it, and cosched counted it, as waiting:
    ``docs/decisions/0016-trace-switch-ins-from-runtime-ticks.md``). Every line names the task
    current on its CPU, though, so a thread seen current without a
    switch-in was switched in unseen. When that line is the thread's own
    ``sched_stat_runtime``, its ``runtime`` is the time since it was
    switched in (the scheduler's ``exec_start``), so it went in then. When
    it is any other line, it is given the earliest time that can have
    happened: when the CPU went idle or the thread became runnable (or, with
    its wake-up unseen, left its CPU), whichever is later. An idle CPU picks
    a runnable thread at once, so the error is the idle exit latency.

    A thread woken on its own CPU by that CPU's idle task (the line's
    current task) waits for no other task, only for the CPU to leave idle:
    it runs from the wake-up, as the kernel bills it and as cosched's meter
    counts it. Should the CPU's first task after that be another, the
    thread waits from then (from the first line that shows it, where the
    switch is hidden).
    """
    out: list[Event] = []
    curr: dict[int, int] = {}           # cpu -> pid current there, as far as seen
    idle_since: dict[int, float] = {}   # cpu -> when it switched to idle
    off: dict[int, float] = {}          # tid -> when it last became runnable, or else left its CPU
    woken: dict[int, int] = {}          # cpu -> thread woken there while it idled, not yet switched in
    running: set[int] = set()
    cgroups = cgroups or {}
    frozen_paths: set[str] = set()

    def frozen(tid: int) -> bool:
        path = cgroups.get(tid, "")
        return any(path == p or path.startswith(p.rstrip("/") + "/") for p in frozen_paths)

    def switch_in(t: float, tid: int) -> None:
        out.append(Event(t, tid, "in"))
        running.add(tid)

    def first_task(t: float, cpu: int, tid: int) -> None:
        """``tid`` is the first task on ``cpu`` since it woke one while idle."""
        w = woken.pop(cpu)
        if w != tid and w in running:
            out.append(Event(t, w, "out-runnable"))
            running.discard(w)
            off[w] = t

    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        pid, cpu, t, kind, rest = int(m.group(2)), int(m.group(3)), float(m.group(4)), m.group(5), m.group(6)
        if kind in CGROUP_EVENTS:
            c = _CGROUP.search(rest)
            if c:
                was = {tid: frozen(tid) for tid in cgroups}
                (frozen_paths.add if kind == "cgroup_freeze" else frozen_paths.discard)(c.group(1))
                out.extend(Event(t, tid, "freeze" if frozen(tid) else "thaw")
                           for tid in sorted(cgroups) if tid in tids and frozen(tid) != was[tid])
            continue
        r = _RUNTIME.search(rest) if kind == "sched_stat_runtime" else None
        ran = int(r.group(2)) / 1e9 if r and int(r.group(1)) == pid else None   # a tick of the line's own task
        if pid != 0 and cpu in woken:          # a switch from idle, hidden
            first_task(t, cpu, pid)
        if curr.get(cpu) != pid:
            if pid in tids and pid not in running:
                since = off.get(pid, t)
                begin = t - ran if ran is not None else idle_since.get(cpu, since)
                switch_in(min(max(begin, since), t), pid)
            curr[cpu] = pid
        if kind == "sched_switch":
            s = _SWITCH.search(rest)
            if not s:
                continue
            prev, state, nxt = int(s.group(1)), s.group(2), int(s.group(4))
            if cpu in woken:
                first_task(t, cpu, nxt)
            if prev in tids:
                preempted = state.startswith("R")
                out.append(Event(t, prev, "out-runnable" if preempted else "out-sleep"))
                running.discard(prev)
                off[prev] = t
            if nxt in tids:
                switch_in(t, nxt)
            curr[cpu] = nxt
            if nxt == 0:
                idle_since[cpu] = t
        elif kind == "sched_stat_runtime":
            if ran is not None and pid in tids:
                out.append(Event(t, pid, "tick"))
        else:
            w = _WAKEUP.search(rest)
            tid = int(w.group(1)) if w else -1
            if tid in tids and tid not in running:
                out.append(Event(t, tid, "wakeup"))
                off[tid] = t
                if pid == 0 and w.group(2) is not None and int(w.group(2)) == cpu and cpu not in woken:
                    woken[cpu] = tid
                    switch_in(t, tid)
    return out


def tracefs_root() -> Path | None:
    """Where tracefs is mounted, from /proc/mounts (None when it is not)."""
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "tracefs":
            return Path(fields[1])
    return None


class SchedTrace:
    """``with SchedTrace(tids, cgroups) as t: ...`` records; then ``t.events``,
    ``t.calls`` (with ``calls=True``: see :func:`setattr_calls`) and
    ``t.overruns``. ``cgroups``: each thread's v2 cgroup path (see :func:`parse`)."""

    def __init__(self, tids: set[int], cgroups: dict[int, str] | None = None, buffer_kb: int = 65536,
                 calls: bool = False):
        self.tids = set(tids)
        self.cgroups = dict(cgroups or {})
        self.buffer_kb = buffer_kb
        self.with_calls = calls
        self.events: list[Event] = []
        self.calls: list[tuple[float, int, bool]] = []
        self.text = ""                    # the raw trace, for analyses of their own
        self.overruns = 0
        self._mounted: Path | None = None
        self.dir: Path | None = None

    def _events(self) -> list[str]:
        return ([f"sched/{e}" for e in SCHED_EVENTS] + [f"cgroup/{e}" for e in CGROUP_EVENTS]
                + [f"syscalls/{e}" for e in CALL_EVENTS if self.with_calls])

    def _write(self, rel: str, value: str) -> None:
        (self.dir / rel).write_text(value)

    def __enter__(self) -> "SchedTrace":
        root = tracefs_root()
        if root is None:
            root = Path("/sys/kernel/tracing")
            subprocess.run(["mount", "-t", "tracefs", "nodev", str(root)], check=True)
            self._mounted = root
        self.dir = root / "instances" / INSTANCE
        if self.dir.exists():
            os.rmdir(self.dir)           # left by an interrupted run
        self.dir.mkdir()
        ids = sorted(self.tids)
        self._write("trace_clock", "mono")
        self._write("buffer_size_kb", str(self.buffer_kb))
        self._write("events/sched/sched_switch/filter",
                    " || ".join(f"prev_pid == {t} || next_pid == {t}" for t in [0, *ids]))
        for ev in SCHED_EVENTS[1:]:
            self._write(f"events/sched/{ev}/filter", " || ".join(f"pid == {t}" for t in ids))
        if self.with_calls:
            self._write(f"events/syscalls/{CALL_EVENTS[0]}/filter", " || ".join(f"pid == {t}" for t in ids))
        for ev in self._events():
            self._write(f"events/{ev}/enable", "1")
        self._write("tracing_on", "1")
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._write("tracing_on", "0")
            if exc[0] is None:
                self.text = (self.dir / "trace").read_text()
                self.events = parse(self.text, self.tids, self.cgroups)
                self.calls = setattr_calls(self.text) if self.with_calls else []
                self.overruns = sum(
                    int(m.group(1)) for stats in self.dir.glob("per_cpu/cpu*/stats")
                    for m in [re.search(r"^overrun: (\d+)", stats.read_text(), re.M)] if m)
        finally:
            for ev in self._events():
                self._write(f"events/{ev}/enable", "0")
            os.rmdir(self.dir)
            if self._mounted is not None:
                subprocess.run(["umount", str(self._mounted)], check=False)
