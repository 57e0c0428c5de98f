"""The in-kernel meter: exact per-guest hazard and per-vCPU run, wait and frozen time.

A BPF program (``meter.bpf.c``, built by ``make meter``) on the scheduler's
``sched_switch`` and ``sched_wakeup`` tracepoints keeps the state of every
vCPU thread it is given (running, waiting for a CPU, sleeping, frozen) and,
per guest, the time some vCPU ran while a sibling waited (the concurrency
hazard) and the time some waited while none ran (partial contention). The
totals are exact to the event, at any window, whatever the number of vCPUs:
what the sampler estimates from ``/proc`` samples, the meter counts. It needs
root, a kernel with BTF (``/sys/kernel/btf/vmlinux``; BPF CO-RE finds the
two ``task_struct`` fields it reads there) and libbpf (``libbpf.so.1``),
loaded here through ctypes; the object file is built at install time with
clang. Where any of that is missing :meth:`Meter.load` raises
:class:`MeterUnavailable` naming what, and the sampler measures instead.

The kernel credits a state when it ends; a reading adds the state in
progress up to the reading's own clock (``CLOCK_MONOTONIC``, the clock of
``bpf_ktime_get_ns``): on a virtual host a vCPU's run time therefore
includes what the hypervisor underneath stole from its CPU, which the
kernel's own run time (and so the sampler) leaves out. A thread is added
in the state its caller read (from ``/proc``), or ``UNKNOWN``, which
counts in nothing until its first switch or wake-up. A thread woken by its
own CPU while that CPU idles runs from its wake-up, as the kernel bills it:
it waits for no other task, only for the CPU to leave idle. Nothing it loads
outlives the process: the programs and maps go with their file descriptors.

The same program reports long waits (:class:`LongWaits`) of the threads
the switcher asks for, as they turn long: what ``/proc`` cannot tell, as
it shows when a wait began nowhere (the kernel's schedstats, which would,
are not built into every kernel).
"""
from __future__ import annotations

import ctypes
import errno
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

OBJECT = Path(__file__).with_name("meter.bpf.o")
LIBBPF = "libbpf.so.1"
UNKNOWN, RUNNING, WAITING, SLEEPING, FROZEN, DEAD = range(6)
BPF_ANY, BPF_NOEXIST, BPF_F_LOCK = 0, 1, 4
BPF_STATS_RUN_TIME = 0
PROGRAMS = ("on_switch", "on_wakeup")


class MeterUnavailable(RuntimeError):
    """The meter cannot run here; the message says why."""


class _Thread(ctypes.Structure):
    _fields_ = [("lock", ctypes.c_uint32), ("guest", ctypes.c_uint32), ("state", ctypes.c_uint32),
                ("pad", ctypes.c_uint32), ("since", ctypes.c_uint64), ("run", ctypes.c_uint64),
                ("wait", ctypes.c_uint64), ("frozen", ctypes.c_uint64)]


class _Guest(ctypes.Structure):
    _fields_ = [("lock", ctypes.c_uint32), ("running", ctypes.c_int32), ("waiting", ctypes.c_int32),
                ("pad", ctypes.c_uint32), ("since", ctypes.c_uint64), ("hazard", ctypes.c_uint64),
                ("partial", ctypes.c_uint64)]


class _BatchOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("elem_flags", ctypes.c_uint64), ("flags", ctypes.c_uint64)]


@dataclass(frozen=True)
class ThreadTimes:
    """One vCPU thread's cumulative seconds since it was added, up to the reading."""

    guest: int
    state: int
    run: float
    wait: float
    frozen: float


@dataclass(frozen=True)
class GuestTimes:
    """One guest's cumulative hazard and partial-contention seconds, up to the reading."""

    hazard: float
    partial: float


@dataclass(frozen=True)
class Reading:
    threads: dict[int, ThreadTimes]
    guests: dict[int, GuestTimes]


def _libbpf() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL(LIBBPF, use_errno=True)
    except OSError as e:
        raise MeterUnavailable(f"{LIBBPF} not found ({e}); install libbpf1") from None
    p, i, u64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64
    sigs = {
        "bpf_object__open_file": (p, [ctypes.c_char_p, p]),
        "bpf_object__load": (i, [p]),
        "bpf_object__close": (None, [p]),
        "bpf_object__find_program_by_name": (p, [p, ctypes.c_char_p]),
        "bpf_object__find_map_by_name": (p, [p, ctypes.c_char_p]),
        "bpf_program__attach": (p, [p]),
        "bpf_link__destroy": (i, [p]),
        "bpf_map__fd": (i, [p]),
        "bpf_map_update_elem": (i, [i, p, p, u64]),
        "bpf_map_delete_elem": (i, [i, p]),
        "bpf_map_get_next_key": (i, [i, p, p]),
        "bpf_map_lookup_batch": (i, [i, p, p, p, p, ctypes.POINTER(ctypes.c_uint32), p]),
        "bpf_enable_stats": (i, [i]),
        "ring_buffer__new": (p, [i, p, p, p]),
        "ring_buffer__epoll_fd": (i, [p]),
        "ring_buffer__consume": (i, [p]),
        "ring_buffer__free": (None, [p]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


def _put(lib: ctypes.CDLL, fd: int, key: int, value, what: str, flags: int = BPF_ANY) -> None:
    """Write ``value`` (a ctypes object) at ``key`` (u32) of map ``fd``; an
    OSError saying it could not ``what``."""
    k = ctypes.c_uint32(key)
    if lib.bpf_map_update_elem(fd, ctypes.byref(k), ctypes.byref(value), flags) != 0:
        e = ctypes.get_errno()
        full = " (its maps are full: meter.bpf.c's CAPACITY threads and guests at once)" if e == errno.E2BIG else ""
        raise OSError(e, f"meter: cannot {what}: {os.strerror(e)}{full}")


def _drop(lib: ctypes.CDLL, fd: int, key: int) -> int:
    """Delete ``key`` (u32) from map ``fd``: 0, or -1 where it was not there."""
    k = ctypes.c_uint32(key)
    return lib.bpf_map_delete_elem(fd, ctypes.byref(k))


class Meter:
    """The loaded and attached meter. :meth:`add` and :meth:`remove` say
    which threads to follow, :meth:`read` returns every figure at once (two
    batch lookups, whatever the number of threads)."""

    def __init__(self, lib: ctypes.CDLL, obj: int, links: list[int], fds: dict[str, int]):
        self.lib, self.obj, self.links, self.fds = lib, obj, links, fds
        self.members: dict[int, int] = {}       # thread id -> guest
        self.guest_ids: set[int] = set()

    @classmethod
    def load(cls, path: Path = OBJECT) -> Meter:
        """Load and attach the meter."""
        if not Path(path).exists():
            raise MeterUnavailable(f"{path} is missing: build it with `make meter` (needs clang and libbpf-dev)")
        if not Path("/sys/kernel/btf/vmlinux").exists():
            raise MeterUnavailable("the kernel has no BTF (/sys/kernel/btf/vmlinux)")
        lib = _libbpf()
        obj = lib.bpf_object__open_file(str(path).encode(), None)
        if not obj:
            raise MeterUnavailable(f"cannot open {path}: {os.strerror(ctypes.get_errno())}")
        links: list[int] = []
        try:
            if lib.bpf_object__load(obj) != 0:
                raise MeterUnavailable(f"the kernel refused the meter: {os.strerror(ctypes.get_errno())}")
            for name in PROGRAMS:
                prog = lib.bpf_object__find_program_by_name(obj, name.encode())
                link = lib.bpf_program__attach(prog) if prog else None
                if not link:
                    raise MeterUnavailable(f"cannot attach {name}: {os.strerror(ctypes.get_errno())}")
                links.append(link)
            fds = {name: lib.bpf_map__fd(lib.bpf_object__find_map_by_name(obj, name.encode()))
                   for name in ("threads", "guests", *LongWaits.MAPS)}
        except BaseException:
            for link in links:
                lib.bpf_link__destroy(link)
            lib.bpf_object__close(obj)
            raise
        return cls(lib, obj, links, fds)

    def long_waits(self) -> dict[str, int] | None:
        """The descriptors of the long-wait reports (:class:`LongWaits`), for
        a new switcher: nothing watched yet (what one killed had asked for
        is dropped). None once the meter is closed (the sampler turned it
        off): the switcher then finds long waits by its looks."""
        if self.obj is None:
            return None
        first = ctypes.c_uint32()
        while self.lib.bpf_map_get_next_key(self.fds["watched"], None, ctypes.byref(first)) == 0:
            if _drop(self.lib, self.fds["watched"], first.value) != 0:
                break
        return {name: self.fds[name] for name in LongWaits.MAPS}

    def close(self) -> None:
        if self.obj is None:
            return
        for link in self.links:
            self.lib.bpf_link__destroy(link)
        self.lib.bpf_object__close(self.obj)
        self.obj = None

    def __enter__(self) -> Meter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _update(self, name: str, key: int, value: ctypes.Structure) -> None:
        _put(self.lib, self.fds[name], key, value, f"add {name[:-1]} {key}")

    def add(self, guest: int, states: dict[int, int]) -> None:
        """Follow guest number ``guest`` (any number the caller chooses) made
        of the threads ``states`` names, each in the state given (``UNKNOWN``:
        counted from its first switch or wake-up), from now on. A guest added
        again starts afresh."""
        if guest in self.guest_ids:
            self.remove(guest)
        now = time.monotonic_ns()
        # the guest first, counting its threads' states: from a thread's insertion on, each of its
        # events moves both, so the counts always match the threads' states
        running = sum(1 for state in states.values() if state == RUNNING)
        waiting = sum(1 for state in states.values() if state == WAITING)
        self._update("guests", guest, _Guest(running=running, waiting=waiting, since=now))
        self.guest_ids.add(guest)
        for tid, state in states.items():
            self._update("threads", tid, _Thread(guest=guest, state=state, since=now))
            self.members[tid] = guest

    def remove(self, guest: int) -> None:
        """Stop following a guest and its threads."""
        for tid in [t for t, g in self.members.items() if g == guest]:
            _drop(self.lib, self.fds["threads"], tid)
            del self.members[tid]
        _drop(self.lib, self.fds["guests"], guest)
        self.guest_ids.discard(guest)

    def _dump(self, name: str, kind: type, n: int) -> dict[int, ctypes.Structure]:
        """Every entry of a map, each read under its lock (BPF_F_LOCK)."""
        n = max(n, 1) + 16              # a batch holds whole hash buckets: room for one more
        keys, values = (ctypes.c_uint32 * n)(), (kind * n)()
        token_in, token_out, count = ctypes.c_uint32(), ctypes.c_uint32(), ctypes.c_uint32()
        opts = _BatchOpts(ctypes.sizeof(_BatchOpts), BPF_F_LOCK, 0)
        out: dict[int, ctypes.Structure] = {}
        first = True
        while True:
            count.value = n
            rc = self.lib.bpf_map_lookup_batch(self.fds[name], None if first else ctypes.byref(token_in),
                                               ctypes.byref(token_out), keys, values, ctypes.byref(count),
                                               ctypes.byref(opts))
            e = ctypes.get_errno() if rc else 0
            for i in range(count.value):
                out[keys[i]] = kind.from_buffer_copy(values[i])
            if rc and e == errno.ENOENT:
                return out
            if rc and e == errno.ENOSPC:
                n *= 2
                keys, values = (ctypes.c_uint32 * n)(), (kind * n)()
                continue
            if rc:
                raise OSError(e, f"meter: cannot read {name}: {os.strerror(e)}")
            token_in.value, first = token_out.value, False

    def read(self) -> Reading:
        """Every followed thread's and guest's cumulative times, the states in
        progress added up to now."""
        threads = self._dump("threads", _Thread, len(self.members))
        guests = self._dump("guests", _Guest, len(self.guest_ids))
        now = time.monotonic_ns()
        tt = {}
        for tid, t in threads.items():
            extra = max(now - t.since, 0) / 1e9
            tt[tid] = ThreadTimes(t.guest, t.state,
                                  t.run / 1e9 + (extra if t.state == RUNNING else 0.0),
                                  t.wait / 1e9 + (extra if t.state == WAITING else 0.0),
                                  t.frozen / 1e9 + (extra if t.state == FROZEN else 0.0))
        gt = {}
        for gid, g in guests.items():
            extra = max(now - g.since, 0) / 1e9
            gt[gid] = GuestTimes(g.hazard / 1e9 + (extra if g.running > 0 and g.waiting > 0 else 0.0),
                                 g.partial / 1e9 + (extra if g.waiting > 0 >= g.running else 0.0))
        return Reading(tt, gt)


_SAMPLE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


class LongWaits:
    """The meter's reports of long waits, for the switcher's ``boost``
    guests: a thread given to :meth:`watch` (and followed by the meter) that
    is still in one wait for a CPU :meth:`set_after`'s nanoseconds after it
    began, while a sibling runs, is reported once, at that moment, by the
    kernel (a BPF timer armed at the wait's start): :meth:`fileno` becomes
    readable and :meth:`take` returns its thread id. The switcher runs in
    its own process: :meth:`Meter.long_waits` gives the descriptors to pass
    it, and :meth:`from_env` takes them back there."""

    MAPS = ("watched", "config", "long_waits")
    ENV = "COSCHED_LONG_WAITS"

    def __init__(self, fds: dict[str, int], lib: ctypes.CDLL | None = None):
        self.lib = lib or _libbpf()
        self.fds = fds
        self._got: list[int] = []
        self._cb = _SAMPLE(self._sample)          # kept: libbpf calls it
        self._rb = self.lib.ring_buffer__new(fds["long_waits"], self._cb, None, None)
        if not self._rb:
            raise OSError(ctypes.get_errno(), f"meter: cannot open the long-wait ring buffer: "
                                              f"{os.strerror(ctypes.get_errno())}")

    @classmethod
    def env(cls, fds: dict[str, int]) -> dict[str, str]:
        """The environment naming descriptors ``fds`` (:meth:`Meter.long_waits`), for :meth:`from_env`."""
        return {cls.ENV: ",".join(f"{name}:{fd}" for name, fd in fds.items())}

    @classmethod
    def _named(cls, environ) -> dict[str, int]:
        """The descriptors ``environ`` names, by map (ValueError if malformed)."""
        value = environ.get(cls.ENV)
        if not value:
            return {}
        fds = {name: int(fd) for name, fd in (part.split(":") for part in value.split(","))}
        if set(fds) != set(cls.MAPS):
            raise ValueError(f"{cls.ENV}={value!r}: expected {', '.join(cls.MAPS)}")
        return fds

    @classmethod
    def fds_in(cls, environ) -> tuple[int, ...]:
        """The descriptors ``environ`` names (to pass to the process it is for)."""
        return tuple(cls._named(environ).values())

    @classmethod
    def from_env(cls, environ) -> LongWaits | None:
        """The reports whose descriptors ``environ`` names (None where it
        names none, or they cannot be used: the switcher then looks only)."""
        try:
            fds = cls._named(environ)
            return cls(fds) if fds else None
        except (ValueError, OSError, MeterUnavailable) as e:
            raise MeterUnavailable(f"long-wait reports unavailable: {e}") from None

    def _sample(self, ctx, data, size) -> int:
        if size >= 4:
            self._got.append(ctypes.c_uint32.from_address(data).value)
        return 0

    def set_after(self, ns: int) -> None:
        """Report a wait once it has lasted ``ns`` (0: report none)."""
        _put(self.lib, self.fds["config"], 0, ctypes.c_uint64(ns), "set the long-wait time")

    def watch(self, tid: int) -> None:
        """Report the long waits of thread ``tid`` (kept as it is if already watched)."""
        try:
            _put(self.lib, self.fds["watched"], tid, _Watch(), f"watch thread {tid}", BPF_NOEXIST)
        except OSError as e:
            if e.errno != errno.EEXIST:
                raise

    def unwatch(self, tid: int) -> None:
        """No more reports of thread ``tid`` (its pending timer goes with it)."""
        _drop(self.lib, self.fds["watched"], tid)

    def fileno(self) -> int:
        return self.lib.ring_buffer__epoll_fd(self._rb)

    def take(self) -> list[int]:
        """The thread ids reported since the last call, oldest first."""
        self.lib.ring_buffer__consume(self._rb)
        got, self._got = self._got, []
        return got

    def close(self) -> None:
        if self._rb:
            self.lib.ring_buffer__free(self._rb)
            self._rb = None


class _Watch(ctypes.Structure):
    _fields_ = [("timer", ctypes.c_uint64 * 2), ("since", ctypes.c_uint64)]


@contextmanager
def run_time_stats():
    """While inside, the kernel counts every BPF program's run time and runs
    (``BPF_ENABLE_STATS``: host-wide, off again when the descriptor closes),
    for :func:`programs_run_time`. For benchmarks: the daemon never turns it on."""
    fd = _libbpf().bpf_enable_stats(BPF_STATS_RUN_TIME)
    if fd < 0:
        raise OSError(-fd, f"cannot enable BPF run-time stats: {os.strerror(-fd)}")
    try:
        yield
    finally:
        os.close(fd)


def programs_run_time(pid: int) -> tuple[float, int]:
    """CPU seconds and runs of the BPF programs process ``pid`` holds open
    (from ``/proc/PID/fdinfo``; counted only under :func:`run_time_stats`)."""
    seconds, runs = 0.0, 0
    base = Path(f"/proc/{pid}/fdinfo")
    for entry in base.iterdir():
        try:
            text = entry.read_text()
        except OSError:
            continue
        info = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        if "prog_type" in info and "run_time_ns" in info:
            seconds += int(info["run_time_ns"]) / 1e9
            runs += int(info.get("run_cnt", "0"))
    return seconds, runs
