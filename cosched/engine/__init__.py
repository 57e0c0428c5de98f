"""The engine: reconcile the plan onto the host, by difference.

On every new snapshot (libvirt event, a vCPU thread gone, periodic resync) the
daemon calls :meth:`Engine.reconcile` with it and its plan, which the
engine never computes itself (:func:`cosched.policy.resolve.resolve` does):

1. log what changed in the plan (guests rejected or left alone, cell notes);
2. record in the journal the original of everything the plan may change
   (``cgroup.freeze``, scheduling policy, RT runtime, vCPU thread affinity);
3. pin each managed vCPU thread where its affinity differs, and put back
   the affinity of guests no longer managed;
4. hand the cells to the switcher process (:mod:`.supervisor`), which runs
   the slot tables.

What the switcher reports becomes metrics and status. A switcher that dies
or stalls is undone (:mod:`.undo`) and replaced. On shutdown the switcher
releases everything, then the journal is replayed in full.
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import replace
from typing import Callable

from cosched.actuators import journal as jr
from cosched.actuators import knobs
from cosched.actuators.affinity import AffinityKnob
from cosched.actuators.sched import SchedAttr, SchedKnob, thread_start
from cosched.engine.supervisor import Supervisor, spawn_switcher
from cosched.engine.undo import restore, undo
from cosched.hostfs import HostFS
from cosched.model import Snapshot
from cosched.policy.confinement import untouchable
from cosched.policy.plan import Plan
from cosched.switcher import protocol as pr

__all__ = ["Engine"]

log = logging.getLogger("cosched.engine")


def target(host, d, v) -> jr.Target:
    """One vCPU of a guest, as the knobs record it."""
    return jr.Target(d.name, d.uuid, v.index, v.tid, v.start_time, host.freeze_file(v), host.rt_chain(v),
                     host.cgroup2_mount)


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

    def __init__(self, fs: HostFS, journal: jr.Journal, *, max_stall_ms: int = 500,
                 switcher_priority: int = 50, dry_run: bool = False, sched: SchedKnob | None = None,
                 affinity: AffinityKnob | None = None, switcher_factory: Callable[[dict], object] = spawn_switcher,
                 resync: Callable[[], None] = lambda: None,
                 long_waits: Callable[[], dict[str, int] | None] = lambda: None):
        self.fs = fs
        self.journal = journal
        self.max_stall_ms = max_stall_ms
        self.dry_run = dry_run
        self.sched = sched if sched is not None else SchedKnob(fs)
        self.knobs = knobs(fs, self.sched, affinity)
        self.affinity = self.knobs["affinity"]
        self.placement = self.knobs["place"]
        self.plan = Plan()
        self.paused = False
        self.op_lock = threading.RLock()      # one reconcile / release at a time
        self._rt_top: int | None = None
        # pinning goes too when a switcher dies: pinned vCPUs that no rotation freezes can
        # starve the host's own tasks, the switcher about to be started among them
        self.switcher = Supervisor(fs, priority=switcher_priority, max_stall_ms=max_stall_ms,
                                   factory=switcher_factory, long_waits=long_waits, op_lock=self.op_lock,
                                   undo=lambda: self._undo(kinds=("sched", "freeze", "rt", "affinity")),
                                   frozen=self._frozen, resync=resync, journal_damage=len(journal.damage))

    def reconfigure(self, max_stall_ms: int) -> None:
        """A reload's new ``max_stall_ms``, from the next plan on."""
        self.max_stall_ms = self.switcher.max_stall_ms = max_stall_ms

    def stats(self) -> pr.Stats:
        """A private copy of the switcher's accumulated figures, safe to read without a lock."""
        return self.switcher.stats()

    def costop(self) -> dict[tuple[str, int], float]:
        """Seconds each (uuid, vCPU) has been held frozen, cumulative."""
        return self.switcher.costop()

    # -- reconcile ------------------------------------------------------
    def reconcile(self, snap: Snapshot, new: Plan) -> Plan:
        """Apply ``new``, the plan of ``snap`` (:func:`cosched.policy.resolve.resolve`)."""
        with self.op_lock:
            return self._reconcile(snap, new)

    def _reconcile(self, snap: Snapshot, new: Plan) -> Plan:
        if not (self.dry_run or self.paused) and self._place(snap):
            self.switcher.resync()           # the next snapshot sees the new cgroups; planned then
        self._rt_top = snap.host.rt_budget_us
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
        if self.switcher.send(self._message(new)):
            self._pin(snap, new)
        else:
            log.warning("action=pin-deferred reason='the switcher has not confirmed the plan'")
        self._collect_garbage(snap)
        return new

    def _record_originals(self, snap: Snapshot, p: Plan) -> None:
        """Journal, through each knob, the original of everything the plan may
        change: scheduling attributes, freeze files and RT runtime of every
        managed vCPU, and the affinity of those it pins."""
        entries: dict[str, dict] = {}
        known = self.journal.entries
        managed = {m.uuid for c in p.cells for m in c.members}
        pinned = {uuid for uuid, _ in p.pins()}
        for d in snap.domains:
            if d.uuid not in managed:
                continue
            kinds = ("sched", "freeze", "rt") + (("affinity",) if d.uuid in pinned else ())
            for v in d.vcpus:
                entries.update(self._recorded(target(snap.host, d, v), kinds, known))
        self.journal.record(entries)

    def _recorded(self, t: jr.Target, kinds, known) -> dict[str, dict]:
        """What the knobs of these kinds record for one vCPU (a knob that
        cannot read its original is logged, and records nothing)."""
        out: dict[str, dict] = {}
        for kind in kinds:
            try:
                out.update(self.knobs[kind].record(t, known))
            except OSError as err:
                log.warning("domain=%s vcpu=%d tid=%d action=%s-info-failed error=%r", t.name, t.vcpu, t.tid, kind,
                            os.strerror(err.errno) if err.errno else str(err))
        return out

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
                    got = self._recorded(target(snap.host, d, v), ("place",), self.journal.entries)
                    if not got:
                        continue
                    self.journal.record(got)
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
        self.journal.forget([key for key, e in self.journal.entries.items()
                             if e.get("kind") in self.knobs and not self.knobs[e["kind"]].exists(e)])

    # -- the switcher ---------------------------------------------------
    def _message(self, p: Plan) -> pr.Orders:
        """The plan as the switcher takes it: each vCPU's return carries the
        attributes the journal recorded for it, which its boosts return it
        to, and until when it must not be boosted, if a restore here
        returned it from one; a guest with a thread whose original is not on
        record is never boosted (it could not be put back)."""
        originals = {e["tid"]: SchedAttr.from_json(e["attr"])
                     for e in self.journal.entries.values() if e.get("kind") == "sched"}

        def member(m):
            return m if all(v.tid in originals for v in m.vcpus) else replace(m, priority=0, boost_ms=0)

        vcpus = [v for c in p.cells for m in c.members for v in m.vcpus]
        return pr.Orders(seq=0, max_stall_ms=self.max_stall_ms, rt_top_us=self._rt_top,
                       cells=tuple(replace(c, members=tuple(member(m) for m in c.members)) for c in p.cells),
                       max_boosted=p.max_boosted,
                       returns=tuple(pr.VcpuReturn(v.tid, originals.get(v.tid, SchedAttr()),
                                                   self.sched.quiet_until(v.tid)) for v in vcpus))

    # -- undo -----------------------------------------------------------
    def _undo(self, kinds=jr.ORDER) -> list[str]:
        return undo(self.journal, self.knobs, self.fs, kinds, self.switcher.released_by)

    def _frozen(self) -> int:
        """vCPUs frozen now, by the journal's freeze entries."""
        return sum(1 for e in list(self.journal.entries.values())
                   if e.get("kind") == "freeze" and (self.fs.read_or(e["path"]) or "").strip() == "1")

    def recover(self) -> None:
        """At start: undo whatever a previous daemon left in the journal."""
        for damage in self.journal.damage:
            log.error("action=journal-damaged %s (an original on it cannot be restored: check that guest by hand)",
                      damage)
        if len(self.journal):
            log.warning("action=recover entries=%d (a previous daemon did not exit cleanly)", len(self.journal))
            self._undo()

    def release(self) -> list[str]:
        """Stop managing: pinning back first (while guests still take turns),
        then the switcher thaws and unboosts, then the rest of the journal."""
        with self.op_lock:
            problems = restore(self.journal, self.knobs, kinds=("affinity",))
            self.switcher.stop()
            return problems + self._undo()

    def pause(self) -> list[str]:
        """``cosched reset`` with a running daemon: restore and stop managing."""
        with self.op_lock:
            self.paused = True
            log.warning("action=paused reason=reset: all guests restored, observed only until restart")
            return self.release()
