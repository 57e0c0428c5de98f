"""Kernel file formats, each parsed in exactly one place.

* ``/proc/PID/task/TID/stat``: :func:`parse_stat`, and :func:`stat_runnable_cpu`
  for the sampler's hot path (the command name sits in parentheses and may
  hold spaces and parentheses, so fields are counted from the last ``)``);
* ``/proc/PID/task/TID/schedstat``: :func:`parse_schedstat`;
* ``/proc/.../status``: :func:`status_field` for one line, :func:`switch_outs`
  and :func:`on_cpu` for the watch's hot path;
* ``/proc/PID/task/TID/sched``: :func:`parse_dl`, a deadline thread's budget;
* ``cgroup.events`` of a cgroup v2 directory: :func:`events_frozen`;
* scheduling policy numbers (``include/uapi/linux/sched.h``): :data:`POLICIES`.
"""
from __future__ import annotations

from dataclasses import dataclass

# The one table of scheduling policies: name <-> number.
POLICIES = {"other": 0, "fifo": 1, "rr": 2, "batch": 3, "idle": 5, "deadline": 6, "ext": 7}
POLICY_NAMES = {n: name for name, n in POLICIES.items()}
REALTIME = ("fifo", "rr")


def policy_name(number: int) -> str:
    """``other``, ``fifo``, ... for a policy number; an unknown one as its digits."""
    return POLICY_NAMES.get(number, str(number))


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/.../stat`` cosched uses."""

    state: str            # field 3: R running or runnable, S sleeping, ...
    start_time: int       # field 22: clock ticks after boot; tells a reused TID apart
    cpu: int              # field 39: the CPU it last ran on
    rt_priority: int      # field 40
    policy: str           # field 41, by name


# ``stat`` field numbers (proc(5)), counted as fields after the ``)`` that
# ends the command name: field 3 (state) is index 0, so field n is n - 3.
_STATE, _START, _CPU, _RT_PRIORITY, _POLICY = 3 - 3, 22 - 3, 39 - 3, 40 - 3, 41 - 3


def parse_stat(text: str | bytes) -> ProcStat | None:
    """The fields of one ``stat`` line, or None when the line is cut short."""
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    fields = text.rpartition(")")[2].split()
    if len(fields) <= _POLICY:
        return None
    try:
        return ProcStat(state=fields[_STATE], start_time=int(fields[_START]), cpu=int(fields[_CPU]),
                        rt_priority=int(fields[_RT_PRIORITY]), policy=policy_name(int(fields[_POLICY])))
    except ValueError:
        return None


def stat_runnable_cpu(raw: bytes) -> tuple[bool, int | None]:
    """(state is ``R``, CPU) from a raw ``stat`` line: the sampler's fast path,
    read for every vCPU a hundred times a second, so no decoding and no objects."""
    fields = raw.rpartition(b")")[2].split()
    try:
        return fields[_STATE] == b"R", int(fields[_CPU])
    except (IndexError, ValueError):
        return False, None


def parse_schedstat(raw: bytes) -> tuple[int, int, int]:
    """(ns run, ns waited on a run queue, times switched in) from a raw ``schedstat`` line."""
    run, wait, switch_ins = raw.split()[:3]
    return int(run), int(wait), int(switch_ins)


def parse_dl(text: str | None) -> tuple[int, int] | None:
    """(budget left in its period, absolute deadline), in ns, of a deadline
    thread from its ``sched`` text (``dl.runtime``, ``dl.deadline``; the
    deadline on the kernel's scheduler clock). A budget at or below 0: the
    kernel has throttled the thread. None without them: the kernel shows
    them only while the thread has SCHED_DEADLINE."""
    found = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("dl.runtime", "dl.deadline"):
            try:
                found[key.strip()] = int(value)
            except ValueError:
                return None
    return (found["dl.runtime"], found["dl.deadline"]) if len(found) == 2 else None


def frozen_usec(raw: bytes) -> int:
    """Microseconds a cgroup has been frozen, from a raw ``cgroup.stat.local``
    (``frozen_usec N``; counted from the write of ``1`` to ``cgroup.freeze``
    to that of ``0``, so a freeze in progress counts)."""
    for line in raw.splitlines():
        key, _, value = line.partition(b" ")
        if key == b"frozen_usec":
            return int(value)
    raise ValueError("no frozen_usec in cgroup.stat.local")


def switch_outs(raw: bytes) -> int:
    """Times switched out (``voluntary_ctxt_switches`` + ``nonvoluntary_ctxt_switches``)
    from a raw ``status``. With ``schedstat``'s switch-ins it tells whether a
    thread is on a CPU now (one switch-in more), which ``stat`` cannot:
    its ``R`` is running or queued."""
    total = 0
    for key in (b"\nvoluntary_ctxt_switches:", b"\nnonvoluntary_ctxt_switches:"):
        i = raw.index(key) + len(key)
        total += int(raw[i:raw.index(b"\n", i)])
    return total


def on_cpu(switch_ins: int, status: bytes) -> bool:
    """Whether a thread is on a CPU now: switched in (``schedstat``'s third
    field) once more than out (:func:`switch_outs` of its raw ``status``)."""
    return switch_ins > switch_outs(status)


def status_field(text: str | None, name: str) -> str | None:
    """The value of one ``Name:`` line of a ``/proc/.../status`` text (None without it)."""
    for line in (text or "").splitlines():
        key, sep, value = line.partition(":")
        if sep and key == name:
            return value.strip()
    return None


def events_frozen(text: str | None) -> bool | None:
    """Whether ``cgroup.events`` says the cgroup is frozen (None without the file)."""
    if text is None:
        return None
    return "frozen 1" in text.splitlines()
