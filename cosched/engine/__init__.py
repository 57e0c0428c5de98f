"""The engine: reconcile the plan onto the host, by difference.

On every new snapshot (libvirt event, vanished thread, periodic resync) the
daemon's discovery thread calls :meth:`Engine.reconcile`:

1. compute the plan (pure: :func:`cosched.policy.plan.plan`);
2. record in the journal the original of everything the plan may change
   (``cgroup.freeze``, scheduling policy, RT runtime, vCPU thread affinity);
3. pin each managed vCPU thread where its affinity differs, and put back
   the affinity of guests no longer managed;
4. hand the cells to the switcher process, which runs the slot tables.

The switcher reports switches, switch latency, slot lateness, costop time,
co-stops and boosts per vCPU, forced thaws and errors; they become metrics and status. If the switcher dies,
the engine restores what it may have left (thread policies, cgroup files),
and starts a new one at the next reconcile. A switcher that has guests to
switch or watch but stays silent and does not run (stopped, starved of
CPU, stuck in the kernel) for :func:`stall_limit` is killed by the
engine's watchdog, and the same restore thaws what it froze, well within
``max_stall_ms``; the vCPUs it left frozen are counted as forced thaws. On shutdown the switcher releases
everything, then the journal is replayed in full.
"""
from __future__ import annotations

import copy
import logging
import os
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from typing import Callable

from cosched.actuators import journal as jr
from cosched.actuators.admission import settle
from cosched.actuators import knobs
from cosched.actuators.affinity import AffinityKnob
from cosched.actuators.rt_runtime import read_runtime
from cosched.actuators.sched import SchedAttr, SchedKnob, thread_start
from cosched.switcher import protocol as pr
from cosched.histogram import Histogram
from cosched.hostfs import HostFS
from cosched.kernel import parse_schedstat
from cosched.model import Snapshot
from cosched.policy.plan import Plan, PlanConfig, plan, untouchable
from cosched.sampler.meter import LongWaits

log = logging.getLogger("cosched.engine")

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.002, 0.005, 0.01, 0.05)
LATENESS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1)


@dataclass
class EngineStats:
    """What the switcher reported, accumulated. Read it through :meth:`Engine.stats`."""

    switches: dict[str, int] = field(default_factory=dict)
    latency: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    lateness: Histogram = field(default_factory=lambda: Histogram(LATENESS_BUCKETS))
    costop: dict[tuple[str, int], float] = field(default_factory=dict)   # (uuid, vcpu) -> seconds
    costops: dict[tuple[str, int], int] = field(default_factory=dict)    # (uuid, vcpu) -> co-stops
    boosts: dict[tuple[str, int], int] = field(default_factory=dict)     # (uuid, vcpu) -> boosts
    forced_thaws: int = 0
    long_waits_held: Counter = field(default_factory=Counter)         # why -> long waits not boosted
    long_waits_reported: int = 0                                      # by the meter
    errors: deque = field(default_factory=lambda: deque(maxlen=50))
    active: dict[str, str] = field(default_factory=dict)
    boost_failed: dict[str, str] = field(default_factory=dict)
    realtime: bool | None = None
    rt_stranded_us: int = 0              # RT runtime granted to cgroups removed while holding it
    error_count: int = 0                 # problems reported so far (errors keeps the last 50)
    journal_damage: int = 0              # lines of the journal found damaged at start
    admission_wrong: bool = False        # the kernel's deadline admission total is wrong and was not recounted


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


class Engine:
    """Reconciles plans onto the host.

    Injection seams, so that tests never touch a real host thread: ``sched``
    (the scheduling knob: reads and writes thread attributes) and
    ``switcher_factory`` (``env -> handle`` with ``stdin``, ``stdout``,
    ``poll``, ``wait``, ``kill`` and ``pid``, like :class:`subprocess.Popen`).
    ``resync`` asks the daemon for a reconcile soon: called when the
    switcher died, so that a new one takes over the rotation (and the
    pinning that only a running rotation may keep) at once.
    """

    def __init__(self, fs: HostFS, journal: jr.Journal, *, reserved_cpus=(), max_stall_ms: int = 500,
                 switcher_priority: int = 50, dry_run: bool = False, sched: SchedKnob | None = None,
                 affinity: AffinityKnob | None = None, switcher_factory: Callable[[dict], object] = spawn_switcher,
                 resync: Callable[[], None] = lambda: None,
                 long_waits: Callable[[], dict[str, int] | None] = lambda: None):
        self.fs = fs
        self.long_waits = long_waits          # the meter's long-wait descriptors now (None: no meter), for a switcher
        self.journal = journal
        self.reserved_cpus = tuple(reserved_cpus)
        self.max_stall_ms = max_stall_ms
        self.switcher_priority = switcher_priority
        self.dry_run = dry_run
        self.sched = sched if sched is not None else SchedKnob(fs)
        self.knobs = knobs(fs, self.sched, affinity)
        self.affinity = self.knobs["affinity"]
        self.placement = self.knobs["place"]
        self.switcher_factory = switcher_factory
        self.resync = resync
        self.plan = Plan()
        self.paused = False
        self._stats = EngineStats(journal_damage=len(journal.damage))
        self.lock = threading.Lock()          # guards _stats
        self.op_lock = threading.RLock()      # one reconcile / release at a time
        self._proc = None
        self._sent: pr.Plan | None = None
        self._rt_top: int | None = None
        self._seq = 0
        self._applied = -1
        self._ready = False
        self._acks = threading.Condition()
        self._heard = 0.0                     # monotonic time of the switcher's last message
        self._released_by = 0                 # a switcher's boosts' bandwidth all released by (Stats.released_by)

    def stats(self) -> EngineStats:
        """A private copy of the switcher's accumulated figures, safe to read without a lock."""
        with self.lock:
            return copy.deepcopy(self._stats)

    def costop(self) -> dict[tuple[str, int], float]:
        """Seconds each (uuid, vCPU) has been held frozen, cumulative."""
        with self.lock:
            return dict(self._stats.costop)

    # -- planning -------------------------------------------------------
    def plan_config(self, snap: Snapshot) -> PlanConfig:
        return PlanConfig(reserved_cpus=self.reserved_cpus, max_stall_ms=self.max_stall_ms,
                          switcher_priority=self.switcher_priority, rt_budget_us=self._rt_budget(snap))

    def _rt_budget(self, snap: Snapshot) -> int | None:
        """RT runtime the vCPU groups may share: the root's, less what other top groups hold."""
        host = snap.host
        if not host.rt_group_sched:
            return None
        try:
            root = read_runtime(self.fs, f"{host.cpu_v1_mount}/cpu.rt_runtime_us")
        except (OSError, ValueError):
            return None
        root = 950_000 if root < 0 else root
        ours = {host.rt_chain(v)[0] for d in snap.domains for v in d.vcpus if host.rt_chain(v)}
        others = 0
        for entry in self.fs.listdir(host.cpu_v1_mount):
            path = f"{host.cpu_v1_mount}/{entry}/cpu.rt_runtime_us"
            if path not in ours and self.fs.exists(path):
                try:
                    others += max(read_runtime(self.fs, path), 0)
                except (OSError, ValueError):
                    pass
        return max(root - others, 0)

    # -- reconcile ------------------------------------------------------
    def reconcile(self, snap: Snapshot) -> Plan:
        with self.op_lock:
            return self._reconcile(snap)

    def _reconcile(self, snap: Snapshot) -> Plan:
        if not (self.dry_run or self.paused) and self._place(snap):
            self.resync()                    # the next snapshot sees the new cgroups; planned then
        cfg = self.plan_config(snap)
        self._rt_top = cfg.rt_budget_us
        new = plan(snap, cfg)
        if new != self.plan:
            for uuid, reason in new.rejected.items():
                if self.plan.rejected.get(uuid) != reason:
                    d = next((d for d in snap.domains if d.uuid == uuid), None)
                    log.warning("domain=%s action=rejected reason=%r", d.name if d else uuid, reason)
            for uuid, reason in new.left_alone.items():
                if self.plan.left_alone.get(uuid) != reason:
                    d = next((d for d in snap.domains if d.uuid == uuid), None)
                    log.warning("domain=%s action=left-alone reason=%r", d.name if d else uuid, reason)
            old_notes = {c.id: c.note for c in self.plan.cells}
            for c in new.cells:
                if c.note and old_notes.get(c.id) != c.note:
                    log.warning("cell=%s action=note %s", c.id, c.note)
        self.plan = new
        if self.dry_run or self.paused:
            return new
        self._record_originals(snap, new)
        # Several runnable vCPUs pinned to one CPU starve the host's own tasks
        # (this daemon included), so pinning only ever exists inside a running
        # rotation: guests leaving it get their pinning back before the
        # switcher thaws them, guests joining are pinned once it froze them.
        self._unpin(new)
        if self._send(new):
            self._pin(snap, new)
        else:
            log.warning("action=pin-deferred reason='the switcher has not confirmed the plan'")
        self._collect_garbage(snap)
        return new

    def _record_originals(self, snap: Snapshot, p: Plan) -> None:
        """Journal, through each knob, the original of everything the plan may change."""
        entries: dict[str, dict] = {}
        known = self.journal.entries
        managed = {m.uuid for c in p.cells for m in c.members}
        pinned = {uuid for uuid, _ in p.pins()}
        for d in snap.domains:
            if d.uuid not in managed:
                continue
            for v in d.vcpus:
                if self.sched.key(v.tid, v.start_time) not in known:
                    try:
                        k, e = self.sched.record(v.tid, v.start_time, name=d.name, vcpu=v.index)
                        entries[k] = e
                    except OSError as err:
                        log.warning("domain=%s vcpu=%d tid=%d action=sched-info-failed error=%r", d.name, v.index,
                                    v.tid, os.strerror(err.errno) if err.errno else str(err))
                freeze = snap.host.freeze_file(v)
                files = ([(self.knobs["freeze"], freeze)] if freeze else []) + [
                    (self.knobs["rt"], path) for path in snap.host.rt_chain(v)]
                for knob, path in files:
                    if knob.key(path) not in known:
                        got = knob.record(path)
                        if got:
                            entries[got[0]] = got[1]
            if d.uuid in pinned:
                for v in d.vcpus:
                    if self.affinity.key(v.tid, v.start_time) not in known:
                        try:
                            k, e = self.affinity.record(v.tid, v.start_time, name=d.name, uuid=d.uuid, vcpu=v.index)
                            entries[k] = e
                        except OSError as err:
                            log.warning("domain=%s vcpu=%d tid=%d action=affinity-info-failed error=%r", d.name,
                                        v.index, v.tid, os.strerror(err.errno) if err.errno else str(err))
        self.journal.record(entries)

    def _pin(self, snap: Snapshot, p: Plan) -> None:
        """Pin each vCPU the plan pins: its thread's affinity, if its
        original is on record. Not through libvirt, whose live XML would
        then carry cosched's pins into saved images, managed saves and
        migrations, where they outlive cosched and pass for the platform's
        (``docs/decisions/0002-pin-thread-affinity.md``)."""
        by_uuid: dict[str, dict[int, int]] = {}
        for (uuid, index), cpu in p.pins().items():
            by_uuid.setdefault(uuid, {})[index] = cpu
        for d in snap.domains:
            if d.uuid in by_uuid:
                self._pin_threads(d, by_uuid[d.uuid])

    def _pin_threads(self, d, pins: dict[int, int]) -> None:
        for v in d.vcpus:
            cpu = pins.get(v.index)
            if cpu is None or self.affinity.key(v.tid, v.start_time) not in self.journal.entries:
                continue
            try:
                if tuple(self.affinity.get(v.tid)) != (cpu,):
                    self.affinity.apply(v.tid, (cpu,))
                    log.info("domain=%s vcpu=%d cpu=%d action=pinned", d.name, v.index, cpu)
            except OSError as err:
                if err.errno not in jr.GONE:
                    log.warning("domain=%s vcpu=%d tid=%d action=pin-failed error=%r", d.name, v.index, v.tid,
                                os.strerror(err.errno) if err.errno else str(err))

    def _unpin(self, p: Plan) -> None:
        """Give guests that leave pinning their own pinning back."""
        keep = {uuid for uuid, _ in p.pins()}
        stale = {e["uuid"] for e in self.journal.entries.values() if e.get("kind") == "affinity" and e["uuid"] not in keep}
        if stale:
            problems = jr.restore(self.journal, self.knobs, kinds=("affinity",), only=lambda e: e["uuid"] in stale)
            for problem in problems:
                log.warning("action=unpin-failed %s", problem)

    def _place(self, snap: Snapshot) -> bool:
        """Give each vCPU thread of a managed guest found as a process its own
        cgroup if it has none (Proxmox VE keeps a guest's threads in one
        scope; see :mod:`~cosched.actuators.placement`). True when a thread moved."""
        mount = snap.host.cgroup2_mount
        if not mount:
            return False
        moved = False
        for d in self._to_place(snap):
            for v in d.vcpus:
                if snap.host.freeze_file(v):
                    continue                                   # it has one
                key = self.placement.key(v.tid, v.start_time)
                if key not in self.journal.entries:
                    got = self.placement.record(v.tid, v.start_time, mount, v.index, name=d.name, uuid=d.uuid,
                                                vcpu=v.index)
                    if got is None:
                        continue
                    self.journal.record(dict([got]))
                try:
                    self.placement.apply(self.journal.entries[key])
                    moved = True
                    log.info("domain=%s vcpu=%d tid=%d action=placed cgroup=%s", d.name, v.index, v.tid,
                             self.journal.entries[key]["dir"])
                except OSError as err:
                    if err.errno not in jr.GONE:
                        log.warning("domain=%s vcpu=%d tid=%d action=place-failed error=%r", d.name, v.index, v.tid,
                                    os.strerror(err.errno) if err.errno else str(err))
        return moved

    @staticmethod
    def _to_place(snap: Snapshot) -> list:
        """Guests found as processes under a policy that may freeze them,
        but none the platform's CPU decisions keep cosched off."""
        return [d for d in snap.domains if d.source != "libvirt" and d.policy is not None and not d.error
                and d.policy.kind not in ("none", "boost") and untouchable(d, snap.host) is None]

    def _collect_garbage(self, snap: Snapshot) -> None:
        """Forget journal entries whose targets are gone for good (a cgroup
        cosched made for a thread that exited is removed first)."""
        # threads back where they were: of guests that need no cgroups of their own any more (the
        # switcher has let them go by now), and directories of threads that exited
        keep = {d.uuid for d in self._to_place(snap)}
        done = {k for k, e in self.journal.entries.items() if e.get("kind") == "place" and (
            e.get("uuid") not in keep or thread_start(self.fs, e["tid"]) != e["start_time"])}
        if done:
            for problem in jr.restore(self.journal, self.knobs, kinds=("place",), only=lambda e: self.placement.key(
                    e["tid"], e["start_time"]) in done):
                log.warning("action=unplace-failed %s", problem)
        # then what is gone, those directories' files with them, in the same pass
        running = {d.uuid for d in snap.domains}
        gone = []
        for key, e in self.journal.entries.items():
            kind = e.get("kind")
            if kind in self.knobs and not self.knobs[kind].exists(e):
                gone.append(key)
        self.journal.forget(gone)

    # -- the switcher ---------------------------------------------------
    def _message(self, p: Plan) -> pr.Plan:
        """The plan as the switcher takes it; each vCPU carries the attributes
        the journal recorded for it, which its boosts return it to, and until
        when it must not be boosted, if a restore here returned it from one."""
        originals = {e["tid"]: SchedAttr.from_json(e["attr"])
                     for e in self.journal.entries.values() if e.get("kind") == "sched"}

        def member(m) -> pr.MemberPlan:
            vcpus = tuple(pr.VcpuPlan(v.index, v.tid, v.freeze, tuple(v.rt_chain), originals.get(v.tid, SchedAttr()),
                                      self.sched.quiet_until(v.tid)) for v in m.vcpus)
            # never boost a thread whose original is not on record: it could not be put back
            recorded = all(v.tid in originals for v in m.vcpus)
            return pr.MemberPlan(m.uuid, m.name, m.slot_ms, m.priority if recorded else 0, vcpus, m.rt_vcpu_us,
                                 m.boost_ms if recorded else 0, m.pause_ms, m.costop_ms, m.costart_ms)

        return pr.Plan(seq=0, max_stall_ms=self.max_stall_ms, rt_top_us=self._rt_top,
                       cells=tuple(pr.CellPlan(c.id, c.mode, tuple(member(m) for m in c.members)) for c in p.cells),
                       max_boosted=p.max_boosted)

    def _send(self, p: Plan, timeout: float = 3.0) -> bool:
        """Hand the plan to the switcher; True once it confirms the plan is in force."""
        if self._proc is None or self._proc.poll() is not None or getattr(self._proc, "stalled", False):
            if not self._start_switcher():
                return False
            self._sent = None
        body = self._message(p)
        if body != self._sent:
            self._seq += 1
            self._heard = time.monotonic()    # silence is counted from the work given, not an idle spell
            try:
                self._proc.stdin.write(pr.encode(replace(body, seq=self._seq)))
                self._proc.stdin.flush()
            except (BrokenPipeError, OSError) as e:
                log.error("action=switcher-write-failed error=%r", str(e))
                return False
            self._sent = body
            proc = self._proc
            with self._acks:                  # a switcher that died will never confirm
                return self._acks.wait_for(lambda: self._applied >= self._seq or proc.poll() is not None, timeout)
        return True

    def _start_switcher(self, timeout: float = 10.0) -> bool:
        """Start the switcher and wait until it runs (realtime, if it may)."""
        env = {k: v for k, v in os.environ.items() if k != LongWaits.ENV}
        fds = self.long_waits()
        env.update(COSCHED_SWITCHER_PRIORITY=str(self.switcher_priority), COSCHED_HOST_ROOT=str(self.fs.root),
                   **(LongWaits.env(fds) if fds else {}))
        self._ready = False
        self._proc = self.switcher_factory(env)
        self._proc.started_at = self._heard = time.monotonic()
        threading.Thread(target=self._read_switcher, args=(self._proc,), name="switcher-stats", daemon=True).start()
        threading.Thread(target=self._watch_switcher, args=(self._proc,), name="switcher-watchdog", daemon=True).start()
        proc = self._proc
        with self._acks:
            self._acks.wait_for(lambda: self._ready or proc.poll() is not None, timeout)
        ready = self._ready and proc.poll() is None
        log.info("action=switcher-started pid=%s ready=%s realtime=%s", proc.pid, ready, self._stats.realtime)
        if not ready and proc.poll() is None:
            log.error("action=switcher-not-ready pid=%s waited_s=%.0f: killing it", proc.pid, timeout)
            proc.kill()
        return ready

    def _read_switcher(self, proc) -> None:
        for line in proc.stdout:
            self._heard = time.monotonic()
            try:
                msg = pr.decode(line)
            except ValueError as e:
                log.warning("action=switcher-message-unreadable error=%r", str(e))
                continue
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
        code = proc.wait()
        with self._acks:
            self._acks.notify_all()
        self._gone(proc, code)

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
            if self._proc is not proc:
                # a reconcile already started the next one and gave it the plan (and the journal's
                # originals): undoing now would thaw what it froze and drop the originals it needs
                log.error("action=switcher-died code=%s lived_s=%.1f: already replaced", code, lived)
                return
            log.error("action=switcher-died code=%s lived_s=%.1f: restoring thread policies, cgroup files and "
                      "pinning, restarting it %s", code, lived, "now" if now else "at the next resync")
            # pinning goes too: pinned vCPUs that no rotation freezes can starve the host's own
            # tasks, the switcher about to be started among them
            self._restore(kinds=("sched", "freeze", "rt", "affinity"))
            self._settle()
        if now:
            self.resync()

    def _ran_ns(self, proc) -> int | None:
        """The switcher's CPU time so far (``/proc/PID/schedstat``); None if unreadable."""
        try:
            return parse_schedstat(self.fs.read_bytes(f"/proc/{proc.pid}/schedstat"))[0]
        except (OSError, ValueError):
            return None

    def _watch_switcher(self, proc) -> None:
        """Kill the switcher if it stays silent while it has guests to switch
        or watch and has not run meanwhile (stopped, starved, stuck); the
        reader thread then restores and restarts. Its own CPU time tells a
        stalled switcher from a daemon slow to read it (on a loaded host,
        this daemon's threads can be held up too); where it cannot be read,
        silence alone decides. A switcher is judged only once it is ready:
        until then it has been given nothing (the plan on record is the last
        one's), and :meth:`_start_switcher` times its start. (A new
        switcher starting on a loaded host was once killed 355 ms into its
        start, and the next only came 10 s later.)"""
        limit = stall_limit(self.max_stall_ms)
        ran, ran_at = self._ran_ns(proc), time.monotonic()
        while proc.poll() is None and self._proc is proc:
            time.sleep(limit / 6)
            now, ran_now = time.monotonic(), self._ran_ns(proc)
            if ran_now != ran:
                ran, ran_at = ran_now, now
            sent = self._sent
            silent = now - self._heard
            if (not getattr(proc, "ready", False) or sent is None or not sent.cells or silent < limit
                    or (ran is not None and now - ran_at < limit) or proc.poll() is not None):
                continue
            frozen = sum(1 for e in list(self.journal.entries.values())
                         if e.get("kind") == "freeze" and (self.fs.read_or(e["path"]) or "").strip() == "1")
            log.error("action=switcher-stalled pid=%s silent_ms=%.0f frozen_vcpus=%d: killing it; what it "
                      "froze or boosted is restored and it is restarted", proc.pid, 1000 * silent, frozen)
            with self.lock:
                self._stats.forced_thaws += frozen
                self._stats.errors.append(f"switcher silent for {1000 * silent:.0f} ms: killed and restarted")
                self._stats.error_count += 1
            proc.stalled = True
            proc.kill()
            # killed, it runs no more of its code, but its exit (and the end of its output, which the
            # reader waits for) can come much later on a loaded host: once 0.6 s later, past max_stall_ms
            self._gone(proc, "SIGKILL")
            return

    def _account(self, msg: pr.Stats) -> None:
        with self.lock:
            s = self._stats
            for cell, n in msg.switches.items():
                s.switches[cell] = s.switches.get(cell, 0) + n
            for ns in msg.latency_ns:
                s.latency.observe(ns / 1e9)
            for ns in msg.lateness_ns:
                s.lateness.observe(ns / 1e9)
            for t in msg.tallies:        # deltas: a restarted switcher does not reset the counters
                key = (t.uuid, t.vcpu)
                s.costop[key] = s.costop.get(key, 0.0) + t.costop_ns / 1e9
                s.costops[key] = s.costops.get(key, 0) + t.costops
                s.boosts[key] = s.boosts.get(key, 0) + t.boosts
            s.forced_thaws += msg.forced_thaws
            s.rt_stranded_us += msg.rt_stranded_us
            if msg.admission_wrong is not None:
                s.admission_wrong = msg.admission_wrong
            self._released_by = max(self._released_by, msg.released_by)
            s.long_waits_held.update(msg.long_waits_held)
            s.long_waits_reported += msg.long_waits_reported
            s.errors.extend(msg.errors)
            s.error_count += len(msg.errors)
            s.active = dict(msg.active)
            s.boost_failed = dict(msg.boost_failed)

    def _stop_switcher(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.stopping = True
        try:
            proc.stdin.write(pr.encode(pr.Stop()))
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log.error("action=switcher-kill reason=no-exit-in-10s")
            proc.kill()
            proc.wait()

    # -- restore --------------------------------------------------------
    def _restore(self, kinds=jr.ORDER) -> list[str]:
        problems = jr.restore(self.journal, self.knobs, kinds)
        for problem in problems:
            log.error("action=restore-failed %s", problem)
        return problems

    def _settle(self) -> list[str]:
        """Once the boosts' bandwidth is released, see that the kernel's
        deadline admission total is right, recounting it if not
        (:func:`cosched.actuators.admission.settle`): boosts returned while
        pinning went back can leave it wrong for every program on the host."""
        problem = settle(self.fs, self.sched, self._released_by)
        return [problem] if problem else []

    def recover(self) -> None:
        """At start: undo whatever a previous daemon left in the journal."""
        for damage in self.journal.damage:
            log.error("action=journal-damaged %s (an original on it cannot be restored: check that guest by hand)",
                      damage)
        if len(self.journal):
            log.warning("action=recover entries=%d (a previous daemon did not exit cleanly)", len(self.journal))
            self._restore()
            self._settle()

    def release(self) -> list[str]:
        """Stop managing: pinning back first (while guests still take turns),
        then the switcher thaws and unboosts, then the rest of the journal."""
        with self.op_lock:
            problems = self._restore(kinds=("affinity",))
            self._stop_switcher()
            self._sent = None
            problems += self._restore()
            return problems + self._settle()

    def pause(self) -> list[str]:
        """``cosched reset`` with a running daemon: restore and stop managing."""
        with self.op_lock:
            self.paused = True
            log.warning("action=paused reason=reset: all guests restored, observed only until restart")
            return self.release()
