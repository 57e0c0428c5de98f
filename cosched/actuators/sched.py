"""The scheduling policy of vCPU threads: read, apply, restore, verify.

cosched raises a vCPU thread above ordinary tasks (a boost) and must put back
exactly what was there: policy, realtime priority, nice value and, for
SCHED_DEADLINE, runtime, deadline and period. ``os.sched_setscheduler`` can
express neither nice nor deadline parameters, so this module speaks the
kernel's ``sched_getattr(2)`` / ``sched_setattr(2)`` directly, through libc's
``syscall``. :data:`cosched.kernel.POLICIES` is the one table of policy names.

How it works, with the measurements behind it: ``docs/design/deadline-boosts.md``.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import threading
import time
from dataclasses import asdict, dataclass
from typing import Mapping

from cosched.actuators.journal import Gone, Target, thread_entry, thread_key
from cosched.hostfs import HostFS, OpenFile
from cosched.kernel import POLICIES, REALTIME, parse_dl, parse_stat, policy_name

KIND = "sched"

# syscall numbers: x86_64 and the generic table (arm64, riscv64), ppc64, s390x
_SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275), "riscv64": (274, 275),
             "ppc64le": (355, 356), "ppc64": (355, 356), "s390x": (345, 346)}
FAIR = ("other", "batch")
SCHED_TEXT_MAX = 16384        # bytes read of /proc/TID/stat or sched (about 2 KB of text on 6.x)
LEAVE_MARGIN_NS = 1_000_000   # reads and calls take time (SchedKnob._straight)
CLOCK_FRESH_NS = 10_000_000_000   # kernel_clock_offset is measured again after this long
_KEEP_FLAGS = 0x07        # SCHED_FLAG_RESET_ON_FORK | RECLAIM | DL_OVERRUN: flags that describe the thread


class _Attr(ctypes.Structure):
    """``struct sched_attr``, version 0 (48 bytes)."""

    _fields_ = [("size", ctypes.c_uint32), ("sched_policy", ctypes.c_uint32), ("sched_flags", ctypes.c_uint64),
                ("sched_nice", ctypes.c_int32), ("sched_priority", ctypes.c_uint32),
                ("sched_runtime", ctypes.c_uint64), ("sched_deadline", ctypes.c_uint64),
                ("sched_period", ctypes.c_uint64)]


@dataclass(frozen=True)
class SchedAttr:
    """A thread's complete scheduling attributes."""

    policy: str = "other"        # a name from cosched.kernel.POLICIES
    priority: int = 0            # realtime priority (fifo, rr)
    nice: int = 0                # other, batch
    runtime_ns: int = 0          # deadline
    deadline_ns: int = 0
    period_ns: int = 0
    flags: int = 0               # SCHED_FLAG_RESET_ON_FORK and friends

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"unknown scheduling policy {self.policy!r} (known: {', '.join(POLICIES)})")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "SchedAttr":
        return cls(**data)

    def __str__(self) -> str:
        if self.policy == "deadline":
            return f"deadline(runtime={self.runtime_ns}ns deadline={self.deadline_ns}ns period={self.period_ns}ns)"
        return f"{self.policy}/{self.priority}" if self.policy in REALTIME else f"{self.policy}(nice {self.nice})"


_libc = None


def _syscall(index: int, *args) -> None:
    global _libc
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        raise OSError(errno.ENOSYS, f"sched_getattr/sched_setattr: unknown syscall numbers on {platform.machine()}")
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.syscall(ctypes.c_long(numbers[index]), *args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def get_attr(tid: int) -> SchedAttr:
    """The thread's scheduling attributes (``sched_getattr``)."""
    attr = _Attr()
    _syscall(1, ctypes.c_int(tid), ctypes.byref(attr), ctypes.c_uint(ctypes.sizeof(attr)), ctypes.c_uint(0))
    policy = policy_name(attr.sched_policy)
    if policy != "deadline":
        # For fair tasks the kernel reports its time slice in sched_runtime;
        # writing it back would pin a custom slice, so it is not part of the record.
        attr.sched_runtime = attr.sched_deadline = attr.sched_period = 0
    return SchedAttr(policy=policy, priority=attr.sched_priority, nice=attr.sched_nice,
                     runtime_ns=attr.sched_runtime, deadline_ns=attr.sched_deadline, period_ns=attr.sched_period,
                     flags=attr.sched_flags & _KEEP_FLAGS)


def set_attr(tid: int, want: SchedAttr) -> None:
    """Give the thread exactly these attributes (``sched_setattr``).

    The kernel applies ``sched_nice`` only to fair policies (other, batch) and
    keeps the nice value of idle, realtime and deadline threads, so for those
    it is set separately (``setpriority``).
    """
    attr = _Attr(size=ctypes.sizeof(_Attr), sched_policy=POLICIES[want.policy], sched_flags=want.flags & _KEEP_FLAGS,
                 sched_nice=want.nice, sched_priority=want.priority if want.policy in REALTIME else 0,
                 sched_runtime=want.runtime_ns, sched_deadline=want.deadline_ns, sched_period=want.period_ns)
    _syscall(0, ctypes.c_int(tid), ctypes.byref(attr), ctypes.c_uint(0))
    if want.policy not in FAIR:
        os.setpriority(os.PRIO_PROCESS, tid, want.nice)


def zero_bandwidth(fs: HostFS) -> SchedAttr:
    """The deadline reservation whose bandwidth the kernel counts as 0: the
    least runtime (1,024 ns) per the longest period the host allows
    (``sched_deadline_period_max_us``, 4.2 s by default)."""
    text = fs.read_or("/proc/sys/kernel/sched_deadline_period_max_us") or ""
    period = int(text) * 1000 if text.strip().isdigit() else 1_000_000_000
    return SchedAttr("deadline", runtime_ns=1024, deadline_ns=period, period_ns=period)


def _stat(fs: HostFS, tid: int):
    """Thread ``tid``'s ``stat`` fields (None if gone)."""
    return parse_stat(fs.read_or(f"/proc/{tid}/stat") or "")


def thread_start(fs: HostFS, tid: int) -> int | None:
    """Start time of thread ``tid`` (None if gone): with the TID, it names one thread for good."""
    stat = _stat(fs, tid)
    return stat.start_time if stat else None


CLOCK_PROBE = SchedAttr("deadline", runtime_ns=1_000_000, deadline_ns=100_000_000, period_ns=100_000_000)


def kernel_clock_offset(fs: HostFS) -> int | None:
    """The kernel's scheduler clock (deadlines in ``/proc/TID/sched``) less
    ``CLOCK_MONOTONIC``, in ns (None if it cannot be measured): a thread of
    this process takes a deadline reservation of 1% of a CPU
    (:data:`CLOCK_PROBE`: its bandwidth is released within its 100 ms
    deadline, :meth:`SchedKnob.released_by`), reads the
    deadline the kernel gave it, and returns itself straight to its policy
    (on a run queue, as the caller of that return, so the kernel lets go of
    it; through the zero reservation it could wait for Python's lock
    between the two calls, wake at that reservation's rate and not run
    again, holding that lock: a test process so hung). The two clocks
    differed by 0.5 ms after 12 hours on this host, and by 142 ms from
    ``CLOCK_MONOTONIC_RAW``: they drift apart, so the knob measures again
    every :data:`CLOCK_FRESH_NS`."""
    probe, found = CLOCK_PROBE, []

    def measure():
        tid = threading.get_native_id()
        try:
            before = time.monotonic_ns()
            set_attr(tid, probe)
            try:
                dl = parse_dl(fs.read_or(f"/proc/{os.getpid()}/task/{tid}/sched"))
            finally:
                set_attr(tid, SchedAttr())
            if dl is not None:
                found.append(dl[1] - probe.deadline_ns - before)
        except OSError:
            pass
    t = threading.Thread(target=measure, name="cosched-clock")
    try:
        t.start()        # refused to a SCHED_DEADLINE caller (EAGAIN), or with no threads left
    except RuntimeError:
        return None
    t.join()
    return found[0] if found else None


class SchedKnob:
    """Apply, record, restore and verify thread scheduling attributes.

    ``get`` and ``set`` default to the real system calls; tests pass fakes,
    so no test ever reaches a real host thread; ``clock`` gives monotonic
    ns. A thread leaves SCHED_DEADLINE through :func:`zero_bandwidth` (see
    the module doc).
    """

    kind = KIND

    def __init__(self, fs: HostFS, get=None, put=None, clock=time.monotonic_ns, offset=None):
        self.fs = fs
        self.get = get or (lambda tid: get_attr(tid))
        self.set = put or (lambda tid, attr: set_attr(tid, attr))
        self.clock = clock
        self._zero = zero_bandwidth(fs)
        self._deadline: dict[int, tuple[int, SchedAttr]] = {}  # threads this knob made deadline threads ->
                                                                # (their period's end, their reservation)
        self._quiet: dict[int, int] = {}     # thread -> until when a deadline reservation would inherit its last one
        self._released = 0                   # when the last bandwidth this knob left counted is released
        self._offset = offset or (lambda: kernel_clock_offset(fs))
        self._offset_at: tuple[int, int | None] | None = None   # (measured when, kernel_clock_offset)
        self._files: dict[int, tuple[OpenFile, OpenFile]] = {}   # thread -> its stat and sched, kept open

    def _put(self, tid: int, attr: SchedAttr, leaving: SchedAttr | None, still=None) -> None:
        if leaving is not None and attr.policy != "deadline" and not self._straight(tid, leaving):
            with still() if still is not None else contextlib.nullcontext():
                # read again once held: a thread that ran out of budget meanwhile cannot be held, and goes straight
                if still is None or not self._straight(tid, leaving):
                    try:
                        self.set(tid, self._zero)
                    except OSError as e:
                        if e.errno == errno.ESRCH:
                            raise
                        # not expected (the reservation only shrinks); the return itself still happens
                self._put(tid, attr, None)
            return
        now = self.clock()
        self.set(tid, attr)
        if attr.policy == "deadline":
            self._deadline[tid] = (now + attr.deadline_ns, attr)  # taken before the call: never later than the kernel's
        else:
            self._deadline.pop(tid, None)

    def _straight(self, tid: int, held: SchedAttr) -> bool:
        """Whether thread ``tid``, holding deadline reservation ``held``, may
        leave SCHED_DEADLINE straight (the module doc says when), noting
        until when it must not re-enter; False: through the zero reservation."""
        if self._offset_now() is None or held.runtime_ns <= 0:
            end = self._deadline.get(tid, (None,))[0]
            left = self.clock()
            if end is None or left >= end:   # its deadline may be behind it, or is not known
                self._hold(tid, left + self._zero.period_ns)
            return False
        shown = self._shown(tid)
        if shown is None:
            return False                     # asleep, or not readable
        budget, lag = shown[0], shown[1] - shown[0] * held.period_ns // held.runtime_ns   # to its zero-lag time
        if lag > LEAVE_MARGIN_NS or budget <= 0:
            until = self.clock() + max(lag, 0) + LEAVE_MARGIN_NS
            self._hold(tid, until)
            self._released = max(self._released, until)
            return True
        return False                         # with a budget it keeps through the zero reservation

    def fresh(self, tid: int) -> bool:
        """Whether thread ``tid``, just given a deadline reservation by this
        knob, took a period of its own: False when it is runnable and the
        kernel shows a deadline already passed (it kept a throttled state
        from an earlier reservation, and is not run) or further away than
        the reservation's (it kept one at the zero reservation's rate): the
        module doc. A budget at or below 0 with the deadline within the
        period is this boost's own, spent before the look. True when that
        cannot be read, and for a thread asleep (the kernel shows its old
        budget until it wakes, and gives it a new one then)."""
        held = self._deadline.get(tid, (None, None))[1]
        shown = self._shown(tid) if held is not None else None
        return shown is None or shown[1] is None or 0 < shown[1] <= held.deadline_ns + LEAVE_MARGIN_NS

    def _shown(self, tid: int) -> tuple[int, int | None] | None:
        """(budget, how far its deadline lies ahead: :meth:`_ahead`) the
        kernel shows for thread ``tid`` if it is runnable; None when it is
        asleep or shows none. Its state is read first: a thread runnable
        then shows, after, the budget it runs on or fell asleep with, not
        one from before it woke."""
        stat = parse_stat(self._read(tid, 0) or "")
        if stat is None or stat.state != "R":
            return None
        dl = parse_dl(self._read(tid, 1))
        return None if dl is None else (dl[0], self._ahead(dl[1]))

    def _read(self, tid: int, which: int) -> str | None:
        """Thread ``tid``'s ``stat`` (``which`` 0) or ``sched`` (1), read
        through a descriptor kept open until :meth:`forget`: the switcher
        reads both around every deadline boost, and a ``pread`` of an open
        file took half the time of opening it by path (1.5 and 2.7 us
        against 3.2 and 4.4 here: ``docs/decisions/0014-host-reads-without-file-objects.md``).
        None once the thread is gone (the kernel answers ESRCH through a
        descriptor of an exited thread, which is then closed)."""
        files = self._files.get(tid)
        if files is None:
            files = self._files[tid] = (self.fs.open_file(f"/proc/{tid}/stat"),
                                        self.fs.open_file(f"/proc/{tid}/sched"))
        try:
            return files[which].read(SCHED_TEXT_MAX)
        except OSError:
            self.forget(tid)
            return None

    def forget(self, tid: int) -> None:
        """Close the files kept open for thread ``tid`` (it is no longer
        boosted by this knob's caller, or gone)."""
        for f in self._files.pop(tid, ()):
            f.close()

    def _offset_now(self) -> int | None:
        """:func:`kernel_clock_offset`, measured again every :data:`CLOCK_FRESH_NS`."""
        now = self.clock()
        if self._offset_at is None or now - self._offset_at[0] > CLOCK_FRESH_NS:
            self._offset_at = (now, self._offset())
            if self._offset_at[1] is not None:   # the probe returned straight: released by its deadline
                self._released = max(self._released, self.clock() + CLOCK_PROBE.deadline_ns)
        return self._offset_at[1]

    def _ahead(self, deadline: int) -> int | None:
        """How far (ns) a deadline on the kernel's scheduler clock lies ahead
        of now; None where the clocks' offset cannot be measured."""
        offset = self._offset_now()
        return None if offset is None else deadline - offset - self.clock()

    def _hold(self, tid: int, until: int) -> None:
        left = self.clock()
        self._quiet = {t: u for t, u in self._quiet.items() if u > left}
        self._quiet[tid] = until

    def quiet_until(self, tid: int) -> int:
        """Until when (``clock`` ns; 0: no such time) thread ``tid`` must not
        enter SCHED_DEADLINE: until the zero-lag time of its last straight
        return, when the kernel lets go of it, or, where the clocks cannot
        be compared, for the zero reservation's period after a return whose
        deadline may have been behind it (the module doc); a reservation
        before then would inherit the last one's budget and deadline."""
        return self._quiet.get(tid, 0)

    def released_by(self) -> int:
        """When (``clock`` ns) the kernel has let go of every deadline
        bandwidth this knob's returns left counted: the zero-lag times of
        its straight returns, and the deadline of its clock probe
        (:func:`kernel_clock_offset`). A return through the zero reservation
        leaves none. Until then a rebuild of the kernel's root domains makes
        its admission total wrong (:mod:`cosched.actuators.admission`)."""
        return self._released

    def holding(self) -> bool:
        """Whether a thread holds a deadline reservation this knob gave it."""
        return bool(self._deadline)

    @staticmethod
    def key(tid: int, start_time: int) -> str:
        """The journal key of one thread's original attributes."""
        return thread_key(KIND, tid, start_time)

    def record(self, target: Target, known: Mapping[str, dict]) -> dict[str, dict]:
        """The thread's current attributes (read now), unless already known."""
        if self.key(target.tid, target.start_time) in known:
            return {}
        return thread_entry(KIND, target, attr=self.get(target.tid).to_json())

    def apply(self, tid: int, attr: SchedAttr, still=None) -> None:
        """Give thread ``tid`` these attributes. ``still``: a context manager
        factory that keeps the thread from running (its vCPU frozen), held
        around a return through the zero reservation (the module doc)."""
        self._put(tid, attr, self._deadline.get(tid, (None, None))[1], still)

    def _same_thread(self, entry: dict) -> None:
        if thread_start(self.fs, entry["tid"]) != entry["start_time"]:
            raise Gone(f"thread {entry['tid']} has exited")

    def restore(self, entry: dict) -> None:
        self._same_thread(entry)
        want = SchedAttr.from_json(entry["attr"])
        tid = entry["tid"]
        now = self.get(tid)
        try:
            self._put(tid, want, now if now.policy == "deadline" and want.policy != "deadline" else None)
        finally:
            self.forget(tid)

    def verify(self, entry: dict) -> bool:
        """True when the thread holds its recorded attributes again, or is gone."""
        try:
            self._same_thread(entry)
            return self.get(entry["tid"]) == SchedAttr.from_json(entry["attr"])
        except (Gone, ProcessLookupError):
            return True

    def exists(self, entry: dict) -> bool:
        return thread_start(self.fs, entry["tid"]) == entry["start_time"]
