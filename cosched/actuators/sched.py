"""The scheduling policy of vCPU threads: read, apply, restore, verify.

cosched raises a vCPU thread above ordinary tasks (a boost) and must put back
exactly what was there: policy, realtime priority, nice value and, for
SCHED_DEADLINE, runtime, deadline and period. ``os.sched_setscheduler`` can
express neither nice nor deadline parameters, so this module speaks the
kernel's ``sched_getattr(2)`` / ``sched_setattr(2)`` directly, through libc's
``syscall``. :data:`cosched.kernel.POLICIES` is the one table of policy names.

The journal entry (kind ``sched``) names the thread by TID *and* start time:
a TID the kernel has since given to another thread is not touched.

Leaving SCHED_DEADLINE takes care. Measured on Linux 6.18:

* a deadline thread set back to another policy while it sleeps, after its
  zero-lag time, keeps its bandwidth counted in the root domain's admission
  total (``dl_bw->total_bw``) after it leaves, and after it exits, until the
  kernel next rebuilds its root domains (a cpuset change, such as libvirt
  removing a guest's cgroup). Boosting blocking guests filled all of the
  host's deadline bandwidth within seconds, after which the kernel refused
  every boost (EBUSY) and every other deadline task on the host. A thread
  first given the smallest reservation the kernel accepts
  (:func:`zero_bandwidth`: 1,024 ns per longest period, which is 0 in the
  kernel's fixed point) and then its own policy leaves nothing behind,
  whatever its state (``tests/test_journal.py`` checks the total after 100
  returns of a thread that runs and sleeps by turns). Deciding by the
  thread's state instead is a race: a thread found runnable that falls
  asleep before the call leaves its bandwidth behind (one return in a
  thousand, measured; enough to refuse every boost within a run);
* but the zero reservation can stop the thread's next boost. The kernel
  keeps a thread's budget and deadline after it leaves and hands them back
  if it re-enters SCHED_DEADLINE before that deadline; a budget that runs
  out under the zero reservation, or a runnable thread whose deadline has
  already passed when it gets the zero reservation, is given a new
  deadline at that reservation's rate, seconds away: the next boost
  stopped the thread for 4.2 s. So this knob notes, for each thread it
  returns through the zero reservation when that thread's deadline may be
  behind it (its boost outlived its period: a switcher held up; or a
  restore, which does not know), until when its next boost would inherit
  such a deadline (:meth:`SchedKnob.quiet_until`: the zero reservation's
  period on). The switcher boosts no vCPU before then, and boosts a vCPU
  afresh only a period after its last boost took effect
  (:class:`cosched.policy.watch.Bcs`); the daemon tells a new switcher
  what it restored (:class:`cosched.engine.protocol.VcpuPlan`).
"""
from __future__ import annotations

import ctypes
import errno
import os
import platform
import time
from dataclasses import asdict, dataclass

from cosched.actuators.journal import Gone
from cosched.hostfs import HostFS
from cosched.kernel import POLICIES, REALTIME, parse_stat, policy_name

KIND = "sched"

# syscall numbers: x86_64 and the generic table (arm64, riscv64), ppc64, s390x
_SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275), "riscv64": (274, 275),
             "ppc64le": (355, 356), "ppc64": (355, 356), "s390x": (345, 346)}
FAIR = ("other", "batch")
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


def thread_start(fs: HostFS, tid: int) -> int | None:
    """Start time of thread ``tid`` (None if gone): with the TID, it names one thread for good."""
    stat = parse_stat(fs.read_or(f"/proc/{tid}/stat") or "")
    return stat.start_time if stat else None


class SchedKnob:
    """Apply, record, restore and verify thread scheduling attributes.

    ``get`` and ``set`` default to the real system calls; tests pass fakes,
    so no test ever reaches a real host thread; ``clock`` gives monotonic
    ns. A thread leaves SCHED_DEADLINE through :func:`zero_bandwidth` (see
    the module doc).
    """

    kind = KIND

    def __init__(self, fs: HostFS, get=None, put=None, clock=time.monotonic_ns):
        self.fs = fs
        self.get = get or (lambda tid: get_attr(tid))
        self.set = put or (lambda tid, attr: set_attr(tid, attr))
        self.clock = clock
        self._zero = zero_bandwidth(fs)
        self._deadline: dict[int, int] = {}  # threads this knob made deadline threads -> their period's end
        self._quiet: dict[int, int] = {}     # thread -> its next deadline reservation may inherit a far deadline until

    def _put(self, tid: int, attr: SchedAttr, deadline_now: bool) -> None:
        if deadline_now and attr.policy != "deadline":
            try:
                self.set(tid, self._zero)
            except OSError as e:
                if e.errno == errno.ESRCH:
                    raise
                # not expected (the reservation only shrinks); the return itself still happens
            left = self.clock()
            if left >= self._deadline.get(tid, left):   # its deadline may be behind it, or is not known
                self._quiet = {t: until for t, until in self._quiet.items() if until > left}
                self._quiet[tid] = left + self._zero.period_ns
        now = self.clock()
        self.set(tid, attr)
        if attr.policy == "deadline":
            self._deadline[tid] = now + attr.deadline_ns  # taken before the call: never later than the kernel's
        else:
            self._deadline.pop(tid, None)

    def quiet_until(self, tid: int) -> int:
        """Until when (``clock`` ns; 0: no such time) thread ``tid`` must not
        enter SCHED_DEADLINE: this knob returned it through the zero
        reservation when its deadline may have been behind it, so the kernel
        may hold a deadline for it up to the zero reservation's period away,
        which a boost before then would inherit (see the module doc)."""
        return self._quiet.get(tid, 0)

    @staticmethod
    def key(tid: int, start_time: int) -> str:
        """The journal key of one thread's original attributes."""
        return f"{KIND}:{tid}:{start_time}"

    def record(self, tid: int, start_time: int, **about) -> tuple[str, dict]:
        """The journal entry holding the thread's current attributes (read
        now); ``about`` (the guest's name, the vCPU index) names it in messages."""
        return self.key(tid, start_time), {"kind": KIND, **about, "tid": tid, "start_time": start_time,
                                           "attr": self.get(tid).to_json()}

    def apply(self, tid: int, attr: SchedAttr) -> None:
        self._put(tid, attr, tid in self._deadline)

    def _same_thread(self, entry: dict) -> None:
        if thread_start(self.fs, entry["tid"]) != entry["start_time"]:
            raise Gone(f"thread {entry['tid']} has exited")

    def restore(self, entry: dict) -> None:
        self._same_thread(entry)
        want = SchedAttr.from_json(entry["attr"])
        tid = entry["tid"]
        self._put(tid, want, want.policy != "deadline" and self.get(tid).policy == "deadline")

    def verify(self, entry: dict) -> bool:
        """True when the thread holds its recorded attributes again, or is gone."""
        try:
            self._same_thread(entry)
            return self.get(entry["tid"]) == SchedAttr.from_json(entry["attr"])
        except (Gone, ProcessLookupError):
            return True

    def exists(self, entry: dict) -> bool:
        return thread_start(self.fs, entry["tid"]) == entry["start_time"]
