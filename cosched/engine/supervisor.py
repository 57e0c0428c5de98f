"""The switcher process, supervised: started, fed plans, read, and watched.

The supervisor starts the switcher (:mod:`cosched.switcher`) when a plan needs
it, hands it each new plan and waits until it confirms the plan is in force,
and adds up what it reports (:class:`~cosched.switcher.protocol.Stats`). A switcher that dies,
or that has guests to switch or watch but stays silent and does not run
(stopped, starved of CPU, stuck in the kernel) for :func:`stall_limit`, is
killed; what it may have left (thread policies, cgroup files, pinning) is
undone at once and a new one is started at the next plan.
"""
from __future__ import annotations

import copy
import logging
import os
import select
import subprocess
import sys
import threading
import time
from dataclasses import replace
from typing import Callable

from cosched.hostfs import HostFS
from cosched.kernel import parse_schedstat
from cosched.sampler.meter import LongWaits
from cosched.switcher import protocol as pr

log = logging.getLogger("cosched.engine")

def stall_limit(max_stall_ms: int) -> float:
    """Seconds of silence after which a busy switcher is taken for stalled:
    half of ``max_stall_ms`` (a busy switcher reports every 0.1 s), at least
    0.3 s, so that the vCPUs it froze are thawed by ``max_stall_ms``."""
    return max(max_stall_ms / 2000, 3 * pr.STATS_EVERY_S)


def spawn_switcher(env: dict) -> subprocess.Popen:
    """The real switcher: its own process (see :mod:`cosched.switcher`),
    given the meter's long-wait descriptors ``env`` names."""
    return subprocess.Popen([sys.executable, "-m", "cosched.switcher"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env, bufsize=1, pass_fds=LongWaits.fds_in(env))


class Supervisor:
    """One switcher at a time (``proc``), and the plan it was last given (``sent``).

    ``factory`` (``env -> handle`` with ``stdin``, ``stdout``, ``poll``,
    ``wait``, ``kill`` and ``pid``, like :class:`subprocess.Popen`) starts
    one; ``long_waits`` gives the meter's long-wait descriptors for it (None:
    no meter). When one dies or is killed, ``undo`` puts back what it may
    have left, under ``op_lock`` (the engine's), unless a newer switcher has
    taken over; ``frozen`` counts the vCPUs frozen now; ``resync`` asks for
    a plan soon, so that a new switcher takes over at once.
    """

    def __init__(self, fs: HostFS, *, priority: int, max_stall_ms: int, factory: Callable[[dict], object],
                 long_waits: Callable[[], dict[str, int] | None], op_lock: threading.RLock,
                 undo: Callable[[], None], frozen: Callable[[], int], resync: Callable[[], None],
                 journal_damage: int = 0):
        self.fs, self.priority, self.max_stall_ms = fs, priority, max_stall_ms
        self.factory, self.long_waits, self.op_lock = factory, long_waits, op_lock
        self.undo, self.frozen, self.resync = undo, frozen, resync
        self._stats = pr.Stats(journal_damage=journal_damage)     # since the daemon started
        self.lock = threading.Lock()          # guards _stats
        self.proc = None
        self.sent: pr.Orders | None = None
        self._seq = 0
        self._applied = -1
        self._ready = False
        self._acks = threading.Condition()
        self._heard = 0.0                     # monotonic time of the switcher's last message

    @property
    def released_by(self) -> int:
        """When every switcher's boosts' bandwidth is let go of (CLOCK_MONOTONIC ns, :attr:`pr.Stats.released_by`)."""
        return self._stats.released_by

    def stats(self) -> pr.Stats:
        """A private copy of the switcher's accumulated figures, safe to read without a lock."""
        with self.lock:
            return copy.deepcopy(self._stats)

    def costop(self) -> dict[tuple[str, int], float]:
        """Seconds each (uuid, vCPU) has been held frozen, cumulative."""
        with self.lock:
            return dict(self._stats.costop)

    def send(self, body: pr.Orders, timeout: float = 3.0) -> bool:
        """Hand the plan to the switcher (started first if none runs); True
        once it confirms the plan is in force."""
        if self.proc is None or self.proc.poll() is not None or getattr(self.proc, "stalled", False):
            if not self._start():
                return False
            self.sent = None
        if body != self.sent:
            self._seq += 1
            self._heard = time.monotonic()    # silence is counted from the work given, not an idle spell
            try:
                self.proc.stdin.write(pr.encode(replace(body, seq=self._seq)))
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError) as e:
                log.error("action=switcher-write-failed error=%r", str(e))
                return False
            self.sent = body
            proc = self.proc
            with self._acks:                  # a switcher that died will never confirm
                return self._acks.wait_for(lambda: self._applied >= self._seq or proc.poll() is not None, timeout)
        return True

    def _start(self, timeout: float = 10.0) -> bool:
        """Start the switcher and wait until it runs (realtime, if it may)."""
        env = {k: v for k, v in os.environ.items() if k != LongWaits.ENV}
        fds = self.long_waits()
        env.update(COSCHED_SWITCHER_PRIORITY=str(self.priority), COSCHED_HOST_ROOT=str(self.fs.root),
                   **(LongWaits.env(fds) if fds else {}))
        self._ready = False
        self.proc = self.factory(env)
        self.proc.started_at = self._heard = time.monotonic()
        threading.Thread(target=self._read, args=(self.proc,), name="switcher-reader", daemon=True).start()
        proc = self.proc
        with self._acks:
            self._acks.wait_for(lambda: self._ready or proc.poll() is not None, timeout)
        ready = self._ready and proc.poll() is None
        log.info("action=switcher-started pid=%s ready=%s realtime=%s", proc.pid, ready, self._stats.realtime)
        if not ready and proc.poll() is None:
            log.error("action=switcher-not-ready pid=%s waited_s=%.0f: killing it", proc.pid, timeout)
            proc.kill()
        return ready

    def _read(self, proc) -> None:
        """Take the switcher's messages as they come and judge it
        (:meth:`_judge`) whenever it has been silent for :func:`stall_limit`:
        one thread, which sleeps while the switcher reports on time."""
        limit = stall_limit(self.max_stall_ms)
        fd = proc.stdout.fileno()
        buf = b""
        ran, ran_at = self._ran_ns(proc), time.monotonic()
        timeout: float | None = limit
        while timeout is not None:
            if select.select([fd], [], [], timeout)[0]:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                *lines, buf = (buf + chunk).split(b"\n")
                for line in lines:
                    self._take(proc, line)
                ran, ran_at = self._ran_ns(proc), time.monotonic()   # it ran: it wrote
            ran, ran_at, timeout = self._judge(proc, limit, ran, ran_at)
        if timeout is None:
            return                            # killed as stalled, and already undone
        code = proc.wait()
        with self._acks:
            self._acks.notify_all()
        self._gone(proc, code)

    def _take(self, proc, line: bytes) -> None:
        """Act on one message from the switcher."""
        self._heard = time.monotonic()
        try:
            msg = pr.decode(line)
        except ValueError as e:
            log.warning("action=switcher-message-unreadable error=%r", str(e))
            return
        if isinstance(msg, (pr.Ready, pr.Applied)):
            with self._acks:
                if isinstance(msg, pr.Ready):
                    with self.lock:
                        self._stats.realtime = msg.realtime
                    self._ready = proc.ready = True
                else:
                    self._applied = msg.seq
                self._acks.notify_all()
        elif isinstance(msg, pr.Stats):
            self._account(msg)

    def _gone(self, proc, code) -> None:
        """Undo what a switcher that died, or that the watchdog killed, left
        behind (once, whichever sees it first), and have it restarted."""
        if getattr(proc, "stopping", False):
            return
        lived = time.monotonic() - getattr(proc, "started_at", 0.0)
        # one that dies at once is not restarted in a loop; one the watchdog killed did not die
        now = lived >= 1.0 or getattr(proc, "stalled", False)
        with self.op_lock:
            if getattr(proc, "undone", False):
                return
            proc.undone = True
            if self.proc is not proc:
                # a reconcile already started the next one and gave it the plan (and the journal's
                # originals): undoing now would thaw what it froze and drop the originals it needs
                log.error("action=switcher-died code=%s lived_s=%.1f: already replaced", code, lived)
                return
            log.error("action=switcher-died code=%s lived_s=%.1f: restoring thread policies, cgroup files and "
                      "pinning, restarting it %s", code, lived, "now" if now else "at the next resync")
            self.undo()
        if now:
            self.resync()

    def _ran_ns(self, proc) -> int | None:
        """The switcher's CPU time so far (``/proc/PID/schedstat``); None if unreadable."""
        try:
            return parse_schedstat(self.fs.read_bytes(f"/proc/{proc.pid}/schedstat"))[0]
        except (OSError, ValueError):
            return None

    def _judge(self, proc, limit: float, ran: int | None, ran_at: float) -> tuple[int | None, float, float | None]:
        """Kill the switcher if it stays silent for ``limit`` while it has
        guests to switch or watch, and has not run in the last sixth of it
        either (stopped, starved, stuck); what it may have left is undone at
        once and a new one asked for. ``ran`` is its CPU time (ns) as last
        read, at ``ran_at`` (monotonic s): read at each report and, once it
        is silent, every sixth of ``limit``, so that a switcher that is
        silent but still runs is looked at again rather than killed, and one
        stopped just after a report is killed about ``limit`` after it (what
        it ran after that report is no sign of life). Where its CPU time
        cannot be read, silence alone decides. A switcher is judged only once
        it is ready: until then it has been given nothing (the plan on record
        is the last one's), and :meth:`_start` times its start. (A new
        switcher starting on a loaded host was once killed 355 ms into its
        start, and the next only came 10 s later.) Returns the CPU time as
        now known, when it was read, and the seconds until the next
        judgement (None: killed)."""
        now = time.monotonic()
        silent = now - self._heard
        if silent < limit:
            return ran, ran_at, limit - silent
        ran_now = self._ran_ns(proc)
        if ran_now != ran:
            ran, ran_at = ran_now, now
        sent = self.sent
        look = limit / 6
        running = ran is not None and now - ran_at < look
        if (not getattr(proc, "ready", False) or sent is None or not sent.cells or self.proc is not proc
                or running or proc.poll() is not None):
            return ran, ran_at, look if running else limit
        frozen = self.frozen()
        log.error("action=switcher-stalled pid=%s silent_ms=%.0f frozen_vcpus=%d: killing it; what it "
                  "froze or boosted is restored and it is restarted", proc.pid, 1000 * silent, frozen)
        with self.lock:
            self._stats.forced_thaws += frozen
            self._stats.error(f"switcher silent for {1000 * silent:.0f} ms: killed and restarted")
        proc.stalled = True
        proc.kill()
        # killed, it runs no more of its code, but its exit (and the end of its output) can come
        # much later on a loaded host: once 0.6 s later, past max_stall_ms. The undo does not wait.
        self._gone(proc, "SIGKILL")
        return ran, ran_at, None

    def _account(self, msg: pr.Stats) -> None:
        with self.lock:
            self._stats.add(msg)

    def stop(self) -> None:
        """Have the switcher release everything and exit (killed after 10 s)."""
        proc, self.proc, self.sent = self.proc, None, None
        if proc is None or proc.poll() is not None:
            return
        proc.stopping = True
        try:
            proc.stdin.write(pr.encode(pr.Stop()))
            proc.stdin.close()
        except (BrokenPipeError, OSError, ValueError):    # gone, or killed as stalled (its stdin closed)
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log.error("action=switcher-kill reason=no-exit-in-10s")
            proc.kill()
            proc.wait()
