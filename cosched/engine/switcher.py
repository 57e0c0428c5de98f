"""The switch loop: turns each cell's slot table into freeze/thaw and boosts, on time.

It runs as its own process (``python -m cosched.engine.switcher``), started
and fed by the daemon, for two reasons measured on real hosts: a Python thread
sharing the daemon's interpreter can be held up to the GIL switch interval
(5 ms) by busy sibling threads, and while boosted vCPUs occupy every CPU an
ordinary (CFS) thread may not run at all. The switcher is single-threaded and
raises itself to SCHED_FIFO above every vCPU boost, so it always gets the CPU
at a slot boundary.

Protocol: the daemon writes one JSON object per line on stdin
(``{"type": "plan", "seq": n, ...}`` or ``{"type": "stop"}``); the switcher
answers ``{"ready": ...}`` once it runs realtime, ``{"applied": n}`` once a
plan is in force, and a JSON stats line every 0.25 s. When stdin closes (the daemon died),
on ``stop``, SIGTERM or SIGINT, it thaws every vCPU it froze, returns every
thread it boosted to its previous policy, takes back every RT runtime grant,
and exits.

Per slot change in a freeze cell, from guest A to guest B: freeze A's vCPUs,
wait until ``cgroup.events`` says they are frozen (so two guests of a cell
never run at once), thaw B's; then return A to its normal policy and boost B.
The switch latency is measured from the first freeze write to the last thaw
write. A guest frozen longer than ``max_stall_ms`` (the switcher was late, or
a plan was inconsistent) is force-thawed and counted.
"""
from __future__ import annotations

import json
import logging
import os
import select
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from cosched.actuators.freezer import set_frozen, wait_frozen
from cosched.actuators.journal import GONE
from cosched.actuators.sched import set_policy
from cosched.hostfs import HostFS

log = logging.getLogger("cosched.switcher")
STATS_EVERY_NS = 250_000_000


@dataclass
class VState:
    """What the switcher did to one vCPU thread."""

    frozen: bool = False
    frozen_since: int = 0
    boosted: bool = False


@dataclass
class MemberState:
    uuid: str
    name: str
    slot_ns: int
    priority: int
    vcpus: list[dict]                   # {"index", "tid", "freeze", "rt_chain"}
    rt_vcpu_us: int | None = None

    def keys(self) -> list[tuple]:
        """One key per vCPU thread and cgroup: a new TID or path is a new vCPU."""
        return [(self.uuid, v["index"], v["tid"], v["freeze"]) for v in self.vcpus]


@dataclass
class CellState:
    id: str
    mode: str
    members: list[MemberState]
    active: int = 0
    deadline: int | None = None
    boost_failed: str | None = None


@dataclass
class Stats:
    switches: dict[str, int] = field(default_factory=dict)
    latency_ns: list[int] = field(default_factory=list)
    lateness_ns: list[int] = field(default_factory=list)
    costop_ns: dict[str, int] = field(default_factory=dict)       # "uuid/index" -> total
    forced_thaws: int = 0
    errors: list[str] = field(default_factory=list)


class Switcher:
    def __init__(self, fs: HostFS, max_stall_ns: int, rt_top_us: int | None = None,
                 set_policy: Callable[[int, str, int], None] = set_policy,
                 clock: Callable[[], int] = time.monotonic_ns):
        self.fs = fs
        self.max_stall_ns = max_stall_ns
        self.rt_top_us = rt_top_us
        self.set_policy = set_policy
        self.clock = clock
        self.cells: dict[str, CellState] = {}
        self.vstate: dict[tuple, VState] = {}
        self.vinfo: dict[tuple, dict] = {}
        self.rt_originals: dict[str, str] = {}
        self.stats = Stats()
        self._reported: set[str] = set()

    # -- errors never stop the loop --------------------------------------
    def _error(self, message: str) -> None:
        if message not in self._reported:
            self._reported.add(message)
            self.stats.errors.append(message)
            log.warning("action=error %s", message)

    # -- per-vCPU actions -------------------------------------------------
    def _freeze(self, key, frozen: bool, now: int) -> None:
        st = self.vstate.setdefault(key, VState())
        info = self.vinfo[key]
        if st.frozen == frozen or not info.get("freeze"):
            return
        try:
            set_frozen(self.fs, info["freeze"], frozen)
        except OSError as e:
            if e.errno not in GONE:
                self._error(f"domain={info['name']} vcpu={key[1]} freeze={frozen}: {os.strerror(e.errno)}")
            return
        if frozen:
            st.frozen, st.frozen_since = True, now
        else:
            costop_key = f"{key[0]}/{key[1]}"
            self.stats.costop_ns[costop_key] = self.stats.costop_ns.get(costop_key, 0) + max(now - st.frozen_since, 0)
            st.frozen = False

    def _rt_write(self, path: str, value: int | str) -> None:
        if path not in self.rt_originals:
            self.rt_originals[path] = self.fs.read(path).strip()
        self.fs.write(path, str(value))

    def _grant(self, cells: dict[str, CellState]) -> None:
        """Hold the RT runtime every boosted member needs (RT group scheduling only).

        Grants are static while a guest is managed. Shrinking grants go first
        (deepest first), growing ones after (top first), so the kernel's rule
        that children never hold more than their parent holds at every step.
        """
        wanted: dict[str, int] = {}
        owner: dict[str, CellState] = {}
        for cell in cells.values():
            for m in cell.members:
                chains = [v["rt_chain"] for v in m.vcpus if v.get("rt_chain")]
                if not (m.priority and m.rt_vcpu_us and chains) or cell.boost_failed:
                    continue
                for c in chains:
                    wanted[c[0]] = max(wanted.get(c[0], 0), self.rt_top_us or 0)
                    for p in c[1:-1]:
                        wanted[p] = m.rt_vcpu_us * len(m.vcpus)
                    wanted[c[-1]] = m.rt_vcpu_us
                    for p in c:
                        owner[p] = cell
        self._restore_rt([p for p in self.rt_originals if p not in wanted])
        current = {p: int(self.fs.read_or(p, "0") or 0) for p in wanted}
        for p in sorted((p for p in wanted if wanted[p] < current[p]), key=lambda p: -p.count("/")):
            try:
                self._rt_write(p, wanted[p])
            except OSError as e:
                if e.errno not in GONE:
                    self._error(f"rt runtime {p}: {os.strerror(e.errno)}")
        for p in sorted(wanted, key=lambda p: p.count("/")):
            if wanted[p] > current.get(p, 0):
                try:
                    self._rt_write(p, wanted[p])
                except OSError as e:
                    if e.errno in GONE:
                        continue
                    cell = owner[p]
                    cell.boost_failed = (f"RT runtime grant {p}={wanted[p]} failed: {os.strerror(e.errno)}; "
                                         f"cell {cell.id} runs freeze-only")
                    self._error(cell.boost_failed)

    def _boost_member(self, cell: CellState, m: MemberState) -> None:
        if not m.priority or cell.boost_failed:
            return
        try:
            for k in m.keys():
                if not self.vstate.setdefault(k, VState()).boosted:
                    self.set_policy(k[2], "fifo", m.priority)
                    self.vstate[k].boosted = True
        except OSError as e:
            if e.errno in GONE:
                return
            cell.boost_failed = (f"boost impossible for domain {m.name}: {os.strerror(e.errno)}; "
                                 f"cell {cell.id} runs freeze-only")
            self._error(cell.boost_failed)
            self._unboost_member(m)

    def _unboost(self, key) -> None:
        st = self.vstate.get(key)
        if st is None or not st.boosted:
            return
        try:
            self.set_policy(key[2], "other", 0)
        except OSError as e:
            if e.errno not in GONE:
                self._error(f"domain={self.vinfo[key]['name']} vcpu={key[1]} unboost: {os.strerror(e.errno)}")
                return
        st.boosted = False

    def _unboost_member(self, m: MemberState) -> None:
        for k in m.keys():
            self._unboost(k)

    def _restore_rt(self, paths) -> None:
        """Put RT runtime files back to their originals, deepest first (a parent
        cannot hold less than its children)."""
        for p in sorted({p for p in paths if p in self.rt_originals}, key=lambda p: -p.count("/")):
            try:
                self.fs.write(p, self.rt_originals.pop(p))
            except OSError as e:
                if e.errno not in GONE:
                    self._error(f"rt runtime restore {p}: {os.strerror(e.errno)}")

    def _release(self, keys: list, now: int) -> None:
        """Thaw and unboost these vCPUs, then take back their RT runtime, and forget them."""
        for k in keys:
            self._freeze(k, False, now)
            self._unboost(k)
        self._restore_rt([p for k in keys for p in self.vinfo[k].get("rt_chain", ())[1:]])   # the top stays
        for k in keys:
            self.vstate.pop(k, None)
            self.vinfo.pop(k, None)

    # -- plans ----------------------------------------------------------
    def apply(self, msg: dict) -> None:
        """Adopt a new plan, keeping each cell's rotation where it can."""
        now = self.clock()
        self.max_stall_ns = int(msg.get("max_stall_ms", self.max_stall_ns / 1e6) * 1e6)
        self.rt_top_us = msg.get("rt_top_us", self.rt_top_us)
        old = self.cells
        cells: dict[str, CellState] = {}
        for c in msg["cells"]:
            members = [MemberState(m["uuid"], m["name"], int(m["slot_ms"] * 1e6), m["priority"], m["vcpus"],
                                   m.get("rt_vcpu_us")) for m in c["members"]]
            cell = CellState(c["id"], c["mode"], members)
            prev = old.get(c["id"])
            if prev is not None and prev.members:
                active_uuid = prev.members[prev.active].uuid
                ids = [m.uuid for m in members]
                if active_uuid in ids:
                    cell.active, cell.deadline = ids.index(active_uuid), prev.deadline
                cell.boost_failed = prev.boost_failed
            cells[c["id"]] = cell
            for m in members:
                for v, k in zip(m.vcpus, m.keys()):
                    self.vinfo[k] = {**v, "name": m.name}
        wanted = {k for c in cells.values() for m in c.members for k in m.keys()}
        self._release([k for k in self.vinfo if k not in wanted], now)
        self.cells = cells
        for cell in cells.values():              # boosts that must go, before their runtime does
            for m in cell.members:
                if not m.priority or cell.boost_failed:
                    self._unboost_member(m)
        self._grant(cells)
        for cell in cells.values():
            self._enter(cell, now, "fresh" if cell.deadline is None else "reapply")
        log.info("action=plan cells=%s", ",".join(f"{c.id}:{len(c.members)}" for c in cells.values()) or "-")

    def _enter(self, cell: CellState, now: int, how: str) -> None:
        """Make the cell's actual state match its active member.

        ``how``: ``fresh`` (a new rotation starts now), ``switch`` (a slot
        boundary: counted and timed, the deadline advances by the slot) or
        ``reapply`` (a new plan kept this member active: deadline unchanged).
        """
        lone = len(cell.members) < 2
        active = cell.members[cell.active]
        t0 = self.clock()
        if cell.mode == "freeze" and not lone:
            outgoing = [k for i, m in enumerate(cell.members) if i != cell.active for k in m.keys()]
            for k in outgoing:
                self._freeze(k, True, t0)
            files = [self.vinfo[k]["freeze"] for k in outgoing if self.vstate[k].frozen]
            t_written = self.clock()
            late = wait_frozen(self.fs, files, True)
            t_waited = self.clock()
            if t_waited - t0 > 5_000_000:
                log.warning("cell=%s action=slow-freeze write_ms=%.2f wait_ms=%.2f", cell.id,
                            (t_written - t0) / 1e6, (t_waited - t_written) / 1e6)
            if late:
                self._error(f"cell {cell.id}: {len(late)} vCPU cgroup(s) not frozen within 50 ms")
        else:
            for m in cell.members:
                for k in m.keys():
                    self._freeze(k, False, t0)
        for k in active.keys():
            self._freeze(k, False, self.clock())
        t1 = self.clock()
        for i, m in enumerate(cell.members):
            if i != cell.active or lone:
                self._unboost_member(m)
        if not lone:
            self._boost_member(cell, active)
        if cell.mode != "freeze":
            t1 = self.clock()
        if lone:
            cell.deadline = None
        elif how == "fresh":
            cell.deadline = now + active.slot_ns
        elif how == "switch":
            self.stats.latency_ns.append(t1 - t0)
            self.stats.switches[cell.id] = self.stats.switches.get(cell.id, 0) + 1
            cell.deadline += active.slot_ns

    def tick(self) -> int | None:
        """Perform every due slot change; return the next deadline (or None)."""
        now = self.clock()
        for cell in self.cells.values():
            if cell.deadline is not None and now >= cell.deadline:
                self.stats.lateness_ns.append(now - cell.deadline)
                cell.active = (cell.active + 1) % len(cell.members)
                if now - cell.deadline > self.max_stall_ns:
                    cell.deadline = now              # hopelessly late: restart the cycle
                self._enter(cell, now, "switch")
        for key, st in self.vstate.items():
            if st.frozen and now - st.frozen_since > self.max_stall_ns:
                self.stats.forced_thaws += 1
                self._error(f"domain={self.vinfo[key]['name']} vcpu={key[1]} frozen over max_stall: force-thawed")
                self._freeze(key, False, now)
        deadlines = [c.deadline for c in self.cells.values() if c.deadline is not None]
        return min(deadlines) if deadlines else None

    def release_all(self) -> None:
        self._release(list(self.vinfo), self.clock())
        self._restore_rt(list(self.rt_originals))
        self.cells = {}

    def take_stats(self) -> dict:
        s, self.stats = self.stats, Stats(costop_ns=self.stats.costop_ns)
        return {"switches": s.switches, "latency_ns": s.latency_ns, "lateness_ns": s.lateness_ns,
                "costop_ns": dict(s.costop_ns), "forced_thaws": s.forced_thaws, "errors": s.errors,
                "active": {c.id: c.members[c.active].uuid for c in self.cells.values() if c.members},
                "boost_failed": {c.id: c.boost_failed for c in self.cells.values() if c.boost_failed}}


def main() -> int:
    """Entry point of the switcher process (see the module docstring)."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    priority = int(os.environ.get("COSCHED_SWITCHER_PRIORITY", "50"))
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
        realtime = True
    except OSError as e:
        realtime = False
        log.warning("action=no-realtime error=%r: boosts disabled, switching may be late", os.strerror(e.errno))
    sw = Switcher(HostFS(os.environ.get("COSCHED_HOST_ROOT", "/")), max_stall_ns=500_000_000)
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.append(1))
    out = sys.stdout
    out.write(json.dumps({"ready": True, "realtime": realtime}) + "\n")
    out.flush()
    buf = b""
    next_stats = time.monotonic_ns() + STATS_EVERY_NS
    deadline = None
    fd = sys.stdin.fileno()
    try:
        while not stopping:
            now = time.monotonic_ns()
            wake = min(d for d in (deadline, next_stats) if d is not None)
            try:
                ready, _, _ = select.select([fd], [], [], max(wake - now, 0) / 1e9)
            except InterruptedError:
                continue
            if ready:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break                              # the daemon is gone
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    msg = json.loads(line)
                    if msg.get("type") == "stop":
                        stopping.append(1)
                    elif msg.get("type") == "plan":
                        if not realtime:
                            for c in msg["cells"]:
                                for m in c["members"]:
                                    m["priority"] = 0
                        sw.apply(msg)
                        out.write(json.dumps({"applied": msg.get("seq")}) + "\n")
                        out.flush()
            deadline = sw.tick()
            if time.monotonic_ns() >= next_stats:
                out.write(json.dumps(sw.take_stats()) + "\n")
                out.flush()
                next_stats += STATS_EVERY_NS
    except BrokenPipeError:
        pass
    finally:
        sw.release_all()
        try:
            out.write(json.dumps({**sw.take_stats(), "released": True}) + "\n")
            out.flush()
        except (BrokenPipeError, ValueError):
            pass
        log.info("action=released")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
