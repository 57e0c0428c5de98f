"""From a snapshot to a plan: cells, slot tables and pinning. Pure code.

A **cell** is a set of host CPUs shared by guests that take turns on it. Each
member gets a slot of ``weight x quantum-ms``; the
cell's cycle is the sum of its members' slots. Members' vCPUs are pinned one
per cell CPU, siblings on distinct CPUs (balance scheduling), spread across
cores before SMT siblings.

How it works, with the measurements behind it: ``docs/design/plan.md``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from cosched.model import Domain, Host, Snapshot
from cosched.policy import confinement
from cosched.policy.params import COSTART, COSTOP, QUANTUM

FREEZE, BOOST, RELAXED = "freeze", "boost", "relaxed"
HOSTED = "hosted"                        # an auto guest left to the host scheduler, in the cell's shared turn
HOSTED_STEP_MS = 10                      # the shared turn's length is a multiple of this
WATCHED = (BOOST, RELAXED)


@dataclass(frozen=True)
class PlanConfig:
    reserved_cpus: tuple[int, ...] = ()
    max_stall_ms: int = 500
    switcher_priority: int = 50
    rt_period_us: int = 1_000_000


@dataclass(frozen=True)
class PlannedVcpu:
    index: int
    tid: int
    start_time: int
    cpu: int
    freeze: str | None                   # host path of cgroup.freeze
    rt_chain: tuple[str, ...] = ()       # cpu.rt_runtime_us files, top-down, ending at the vCPU


@dataclass(frozen=True)
class Member:
    uuid: str
    name: str
    slot_ms: int
    priority: int                        # SCHED_FIFO priority in its slot; 0: no boost
    vcpus: tuple[PlannedVcpu, ...]
    rt_vcpu_us: int | None = None        # RT runtime granted to each vCPU's cgroup
    boost_ms: int = 0                    # watched guests: longest boost, 0: none
    pause_ms: int = 0                    # watched guests: least time between two boosts of a vCPU
    costop_ms: int = 0                   # relaxed: co-stop / co-start thresholds
    costart_ms: int = 0
    hosted: bool = False                 # the host scheduler runs it in the shared turn: not pinned, mode none


@dataclass(frozen=True)
class Cell:
    id: str
    mode: str                            # FREEZE, BOOST or RELAXED
    cpus: tuple[int, ...]
    members: tuple[Member, ...]
    note: str | None = None
    kind: str = ""                       # the policy its members run: gang, partial, boost, relaxed

    @property
    def turns(self) -> tuple[tuple[int, ...], ...]:
        """The cycle in order: each turn the indices of the members that run
        in it, one member alone, or every hosted member together (one shared
        turn, where the first of them stands; its length is their slot)."""
        out: list[list[int]] = []
        shared = None
        for i, m in enumerate(self.members):
            if not m.hosted:
                out.append([i])
            elif shared is None:
                shared = len(out)
                out.append([i])
            else:
                out[shared].append(i)
        return tuple(tuple(t) for t in out)

    def turn_ms(self, turn: tuple[int, ...]) -> int:
        return self.members[turn[0]].slot_ms

    @property
    def cycle_ms(self) -> int:
        return sum(self.turn_ms(t) for t in self.turns)

    @property
    def max_stall_ms(self) -> int:
        """Longest time any member spends frozen per cycle."""
        turns = self.turns
        if self.mode != FREEZE or len(turns) < 2:
            return 0
        return self.cycle_ms - min(self.turn_ms(t) for t in turns)


@dataclass(frozen=True)
class Plan:
    cells: tuple[Cell, ...] = ()
    rejected: dict[str, str] = field(default_factory=dict)      # uuid -> reason
    left_alone: dict[str, str] = field(default_factory=dict)    # uuid -> why the platform's decisions leave it alone
    confined: dict[str, dict[int, tuple[int, ...]]] = field(default_factory=dict)  # uuid -> vCPU -> CPUs it may use
    pool: tuple[int, ...] = ()           # the co-scheduling pool: host CPUs less reserved and held ones

    @property
    def max_boosted(self) -> int:
        """Watched vCPUs boosted at once, at most: one per pool CPU."""
        return len(self.pool)

    def cell_of(self, uuid: str) -> Cell | None:
        return next((c for c in self.cells if any(m.uuid == uuid for m in c.members)), None)

    def member(self, uuid: str) -> Member | None:
        return next((m for c in self.cells for m in c.members if m.uuid == uuid), None)

    def mode_of(self, uuid: str) -> str | None:
        """The mode in force for a managed guest (None: not managed); ``none``
        for a hosted guest, which the host scheduler runs within its slot."""
        cell = self.cell_of(uuid)
        if cell is None:
            return None
        return "none" if self.member(uuid).hosted else cell.kind

    def composition(self) -> list[dict]:
        """The host's co-scheduling at a glance (``cosched explain``): per
        cell, its kind, CPUs and its slots in turn, each with the guest, its
        mode, length, whether the host scheduler places it (hosted) and its
        turn (hosted guests share one)."""
        return [{"cell": c.id, "kind": c.kind, "cpus": list(c.cpus), "cycle_ms": c.cycle_ms, "note": c.note,
                 "slots": [{"domain": m.name, "uuid": m.uuid, "mode": "none" if m.hosted else c.kind,
                            "slot_ms": m.slot_ms, "hosted": m.hosted, "turn": t}
                           for t, turn in enumerate(c.turns) for m in (c.members[i] for i in turn)]}
                for c in self.cells]

    def pins(self) -> dict[tuple[str, int], int]:
        """(domain uuid, vCPU index) -> host CPU, for guests in freeze cells
        and under relaxed; hosted guests are not pinned."""
        return {(m.uuid, v.index): v.cpu for c in self.cells if c.mode in (FREEZE, RELAXED)
                for m in c.members if not m.hosted for v in m.vcpus}


def pool_order(host: Host, reserved: tuple[int, ...]) -> list[int]:
    """Pool CPUs, grouped by NUMA node, one CPU per core before SMT siblings."""
    def key(cpu):
        siblings = host.siblings(cpu)
        return (host.node_of.get(cpu, 0), siblings.index(cpu), host.core_of.get(cpu, (0, cpu)), cpu)
    return sorted((c for c in host.cpus if c not in set(reserved)), key=key)


def _slot_ms(d: Domain) -> int:
    p = dict(d.policy.params)
    return p["weight"] * p["quantum-ms"]


def hosted_turn_ms(quanta: list[int], busy: list[float], pool_cpus: int, gang: list[int] = (),
                   keep_pct: int = 0) -> int:
    """The length of the turn the hosted guests share: long enough that
    together they get the CPU time per cycle that as many gang guests filling
    the pool would (each its quantum on every pool CPU), on the CPUs their
    busy vCPUs (``busy``: vCPUs' worth of work each) can use at once; in
    steps of :data:`HOSTED_STEP_MS`, so that noise in the measurement does
    not replan, from the shortest quantum to the longest a quantum may be.

    With ``keep_pct``, at most so long that the gang guests' slots
    (``gang``) keep that percent of the share of the cycle they would have
    if the hosted guests took gang slots of their quanta instead (rounded
    down to a step, never under the shortest quantum)."""
    usable = min(max(sum(busy), 1.0), pool_cpus)
    turn = round(sum(quanta) * pool_cpus / usable / HOSTED_STEP_MS) * HOSTED_STEP_MS
    if keep_pct and gang:
        most = (sum(gang) + sum(quanta)) * 100 / keep_pct - sum(gang)
        turn = min(turn, int(most // HOSTED_STEP_MS) * HOSTED_STEP_MS)
    return int(min(max(turn, min(quanta)), QUANTUM.max))


def _hosted_turn(domains: list[Domain], pool: list[int], gang: list[Domain] = ()) -> int:
    """The shared turn of hosted ``domains`` beside the ``gang`` guests; the
    strictest ``keep-pct`` among them bounds it."""
    return hosted_turn_ms([_slot_ms(d) for d in domains],
                          [dict(d.policy.params).get("busy", len(d.vcpus)) for d in domains], len(pool),
                          [_slot_ms(g) for g in gang],
                          max(dict(d.policy.params).get("keep-pct", 0) for d in domains))


def _member(d: Domain, host: Host, cpus: list[int], boost: bool, cfg: PlanConfig, turn_ms: int = 0) -> Member:
    """A cell's member; ``cpus``: the CPU of each vCPU (unused for a hosted
    guest, whose slot is the shared turn, ``turn_ms``)."""
    if d.policy.kind == HOSTED:
        vcpus = tuple(PlannedVcpu(index=v.index, tid=v.tid, start_time=v.start_time, cpu=-1, freeze=host.freeze_file(v))
                      for v in d.vcpus)
        return Member(d.uuid, d.name, turn_ms, 0, vcpus, hosted=True)
    p = dict(d.policy.params)
    priority = min(p.get("priority", 1), cfg.switcher_priority - 1) if boost else 0
    vcpus = tuple(
        PlannedVcpu(
            index=v.index, tid=v.tid, start_time=v.start_time, cpu=cpus[i],
            freeze=host.freeze_file(v),
            rt_chain=host.rt_chain(v),
        )
        for i, v in enumerate(d.vcpus)
    )
    return Member(d.uuid, d.name, _slot_ms(d), priority, vcpus)


def _stall_after(members_slots: list[int], slot: int) -> int:
    slots = members_slots + [slot]
    return sum(slots) - min(slots) if len(slots) > 1 else 0


def _unfreezable(d: Domain, host: Host) -> str | None:
    """Why a guest's vCPUs cannot be frozen one by one (None: they can)."""
    if not all(host.freeze_file(v) for v in d.vcpus):
        return ("its vCPU threads are not (yet) in per-vCPU cgroups, which freezing needs (libvirt makes "
                "them; for a guest found as a process cosched does)")
    shared = [v for v in d.vcpus if v.cgroup_shared]
    if shared:
        v = shared[0]
        return (f"the cgroup of its vCPU {v.index} ({v.cgroup2}) holds other tasks too (tid "
                f"{', '.join(map(str, v.cgroup_shared))}): freezing it would stop them, and a kernel worker "
                "there can keep the freeze from ever completing")
    return None


def _unfit(d: Domain, host: Host, pool: list[int]) -> str | None:
    """Why a guest cannot be pinned one vCPU per pool CPU and frozen per vCPU (None: it can)."""
    reason = _unfreezable(d, host)
    if reason:
        return reason
    if len(d.vcpus) > len(pool):
        return f"it has {len(d.vcpus)} vCPUs but the co-scheduling pool has {len(pool)} CPUs"
    return None


def _gang(domains: list[Domain], hosted: list[Domain], host: Host, pool: list[int], cfg: PlanConfig,
          allowed: dict, rejected: dict) -> list[Cell]:
    """The gang cell: its guests, then one turn shared by the hosted guests
    that fit in it (the rest run free)."""
    admitted: list[Domain] = []
    where: dict[str, list[int]] = {}
    for d in sorted(domains, key=lambda d: d.name):
        where[d.uuid] = confinement.place(d, allowed[d.uuid], pool)
        if allowed[d.uuid] and where[d.uuid] is None:
            rejected[d.uuid] = confinement.confined(d, allowed[d.uuid], pool, "gang cell's")
            continue
        reason = _unfit(d, host, pool)
        if reason is None:
            stall = _stall_after([_slot_ms(a) for a in admitted], _slot_ms(d))
            if stall > cfg.max_stall_ms:
                reason = (f"the gang cell is full: admitting it would freeze guests for {stall} ms "
                          f"per cycle (max_stall_ms {cfg.max_stall_ms})")
        if reason:
            rejected[d.uuid] = f"not managed: {reason}"
            continue
        admitted.append(d)
    if not admitted:
        return []
    sharing: list[Domain] = []
    for d in sorted(hosted, key=lambda d: d.name):
        if (_unfreezable(d, host) is None and
                _stall_after([_slot_ms(a) for a in admitted], _hosted_turn(sharing + [d], pool, admitted))
                <= cfg.max_stall_ms):
            sharing.append(d)
    turn = _hosted_turn(sharing, pool, admitted) if sharing else 0
    boost = len(admitted) + bool(sharing) > 1
    members = tuple(_member(d, host, where.get(d.uuid, []), boost and dict(d.policy.params)["boost"], cfg, turn)
                    for d in admitted + sharing)
    return [Cell("gang", FREEZE, tuple(pool), members, kind="gang")]


def _packed(kind: str, domains: list[Domain], host: Host, pool: list[int], cfg: PlanConfig,
            allowed: dict, rejected: dict) -> list[Cell]:
    cells: list[tuple[list[int], list[Domain]]] = []
    free = list(pool)
    where: dict[str, list[int]] = {}
    # largest first, and among equals the confined ones, whose choice of CPUs is smaller
    for d in sorted(domains, key=lambda d: (-len(d.vcpus), not allowed[d.uuid], d.name)):
        if allowed[d.uuid] and confinement.place(d, allowed[d.uuid], pool) is None:
            rejected[d.uuid] = confinement.confined(d, allowed[d.uuid], pool, f"{kind} pool's")
            continue
        reason = _unfit(d, host, pool)
        if reason:
            rejected[d.uuid] = f"not managed: {reason}"
            continue
        k = len(d.vcpus)
        fresh = confinement.place(d, allowed[d.uuid], free)
        if fresh is not None:
            where[d.uuid] = fresh
            cells.append(([c for c in free if c in fresh], [d]))
            free = [c for c in free if c not in fresh]
            continue
        fitting = [(c, placed) for c in cells
                   if _stall_after([_slot_ms(m) for m in c[1]], _slot_ms(d)) <= cfg.max_stall_ms
                   and (placed := confinement.place(d, allowed[d.uuid], c[0])) is not None]
        if not fitting:
            rejected[d.uuid] = (f"not managed: no {kind} cell of {k} CPUs has room "
                                f"(pool {len(pool)} CPUs, max_stall_ms {cfg.max_stall_ms})")
            continue
        cell, where[d.uuid] = min(fitting, key=lambda f: sum(_slot_ms(m) for m in f[0][1]))
        cell[1].append(d)
    out = []
    for i, (cpus, ds) in enumerate(cells):
        boost = len(ds) > 1
        members = tuple(_member(d, host, where[d.uuid], boost and dict(d.policy.params)["boost"], cfg) for d in ds)
        out.append(Cell(f"{kind}-{i}", FREEZE, tuple(cpus), members, kind=kind))
    return out


def _watched(domains: list[Domain], host: Host, pool: list[int], allowed: dict, rejected: dict) -> list[Cell]:
    """One cell per guest under ``boost`` or ``relaxed``: nothing shared; relaxed pinned for balance."""
    out = []
    next_cpu, index_on = 0, {}
    for d in sorted(domains, key=lambda d: d.name):
        kind, p = d.policy.kind, dict(d.policy.params)
        placed = None                        # a confined relaxed guest's CPUs, from the next pool CPU on
        if kind == RELAXED and allowed[d.uuid] and pool:
            placed = confinement.place(d, allowed[d.uuid], pool[next_cpu % len(pool):] + pool[:next_cpu % len(pool)])
            if placed is None:
                rejected[d.uuid] = confinement.confined(d, allowed[d.uuid], pool, "pool's")
                continue
        reason = _unfit(d, host, pool) if kind == RELAXED else (
            None if pool else "the co-scheduling pool is empty (reserved_cpus holds every CPU): nothing may be boosted")
        if reason:
            rejected[d.uuid] = f"not managed: {reason}"
            continue
        boost_ms = p["boost-ms"] if kind == BOOST or p.get("boost") else 0
        cpus = [-1] * len(d.vcpus)
        if placed is not None:
            cpus = placed
            next_cpu += len(d.vcpus)
        elif kind == RELAXED:
            cpus = _balanced(len(d.vcpus), [pool[(next_cpu + j) % len(pool)] for j in range(len(d.vcpus))], index_on)
            next_cpu += len(d.vcpus)
        # a pinned (relaxed) vCPU cannot take SCHED_DEADLINE: its boosts are SCHED_FIFO, which RT
        # group scheduling allows only with runtime granted along its cgroup path
        vcpus = tuple(PlannedVcpu(index=v.index, tid=v.tid, start_time=v.start_time, cpu=cpu,
                                  freeze=host.freeze_file(v), rt_chain=host.rt_chain(v) if boost_ms else ())
                      for v, cpu in zip(d.vcpus, cpus))
        member = Member(d.uuid, d.name, 0, 0, vcpus, boost_ms=boost_ms, pause_ms=p["pause-ms"] if boost_ms else 0,
                        costop_ms=p.get("costop-ms", 0), costart_ms=p.get("costart-ms", 0))
        out.append(Cell(f"{kind}-{d.name}", kind, (), (member,), kind=kind))
    return out


def _balanced(n: int, slots: list[int], index_on: dict[tuple[int, int], int]) -> list[int]:
    """The CPUs ``slots`` (the next ``n`` pool CPUs in turn, so every CPU
    holds about as many relaxed vCPUs) handed to a guest's ``n`` vCPUs in
    the rotation that puts each where the fewest vCPUs of its index are;
    ``index_on`` ((vCPU index, CPU): how many) is updated.

    This matters for guests whose work sits on one vCPU (in the probe the
    guest kernel ran its one busy thread on vCPU 0 every time): handed out in
    order, 2-vCPU guests on 2 CPUs all had vCPU 0 on the same CPU, and two
    such guests ran at 0.48x the host scheduler
    (``docs/decisions/0013-relaxed-paced-and-rotated.md``)."""
    def collisions(r: int) -> tuple[int, int]:
        return sum(index_on.get((j, slots[(r + j) % n]), 0) for j in range(n)), r
    r = min(range(n), key=collisions)
    cpus = [slots[(r + j) % n] for j in range(n)]
    for j, c in enumerate(cpus):
        index_on[(j, c)] = index_on.get((j, c), 0) + 1
    return cpus


def _rt_budgets(cells: list[Cell], budget_us: int | None, cfg: PlanConfig) -> list[Cell]:
    """Split the host's RT budget (None: no RT group scheduling, no limit)
    among boosted vCPUs; turn boost off where it cannot last."""
    def boosted(cs):
        return [v for c in cs for m in c.members if (m.priority or m.boost_ms) and m.vcpus[0].rt_chain
                for v in m.vcpus]
    if budget_us is None or not boosted(cells):
        return cells
    out = list(cells)
    # cells whose members need the largest share lose their boost first
    while boosted(out):
        share = budget_us // len(boosted(out))
        worst = None
        for i, c in enumerate(out):
            need = max((m.slot_ms / c.cycle_ms for m in c.members if m.priority), default=0.0)
            if need and need * 1.1 > share / cfg.rt_period_us and (worst is None or need > worst[1]):
                worst = (i, need)
        if worst is None:
            return [replace(c, members=tuple(replace(m, rt_vcpu_us=share if m.priority or m.boost_ms else None)
                                             for m in c.members)) for c in out]
        i, need = worst
        c = out[i]
        note = (f"boost off: with RT group scheduling each boosted vCPU may hold {share / cfg.rt_period_us:.0%} "
                f"of a period, a guest here needs {need:.0%} (its share of the cycle); freeze-only")
        out[i] = replace(c, members=tuple(replace(m, priority=0) for m in c.members), note=note)
    return out


def _lone_relaxed(cells: list[Cell]) -> list[Cell]:
    """A freeze cell of one guest cannot rotate: co-stop its leaders instead, and say so."""
    return [replace(c, mode=RELAXED, note=f"{c.members[0].name} alone in its {c.kind} cell, nothing to take turns "
                                          "with: its leading vCPUs are co-stopped as under relaxed",
                    members=tuple(replace(m, priority=0, rt_vcpu_us=None, boost_ms=0,
                                          costop_ms=COSTOP.default, costart_ms=COSTART.default)
                                  for m in c.members))
            if c.mode == FREEZE and len(c.members) == 1 else c for c in cells]


def plan(snapshot: Snapshot, cfg: PlanConfig) -> Plan:
    """The plan for every managed guest in ``snapshot``."""
    host = snapshot.host
    by_kind: dict[str, list[Domain]] = {"gang": [], "partial": [], BOOST: [], RELAXED: [], HOSTED: []}
    left_alone: dict[str, str] = {}
    held: set[int] = set()
    allowed: dict[str, dict[int, tuple[int, ...]]] = {}
    for d in snapshot.domains:
        pins = confinement.pins(d, host)
        alone = confinement.left_alone(d, pins)
        if alone is not None:
            held.update(alone[1])
            if d.policy is not None and d.error is None and d.policy.kind != "none":
                left_alone[d.uuid] = alone[0]
            continue
        allowed[d.uuid] = confinement.allowed(d, host, pins)
        # a guest without vCPU threads is starting or stopping: nothing to plan yet
        if d.policy is not None and d.error is None and d.policy.kind in by_kind and d.vcpus:
            by_kind[d.policy.kind].append(d)
    pool = pool_order(host, tuple(sorted(set(cfg.reserved_cpus) | held)))
    rejected: dict[str, str] = {}
    cells = (_gang(by_kind["gang"], by_kind[HOSTED], host, pool, cfg, allowed, rejected)
             + _packed("partial", by_kind["partial"], host, pool, cfg, allowed, rejected))
    watched = _watched(by_kind[BOOST] + by_kind[RELAXED], host, pool, allowed, rejected)
    return Plan(tuple(_lone_relaxed(_rt_budgets(cells + watched, host.rt_budget_us, cfg))), rejected, left_alone,
                {u: a for u, a in allowed.items() if a}, pool=tuple(sorted(pool)))
