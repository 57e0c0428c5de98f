"""What the platform decided about a guest's CPUs, as the planner keeps to it. Pure code.

A guest's own pins (``<vcpupin>``), its threads' affinity when first seen and
its cgroup's cpuset confine where each vCPU may run (:func:`allowed`); a
guest whose every vCPU has a CPU of its own, or that has realtime vCPUs, is
left alone altogether (:func:`left_alone`). The planner places a confined
guest's vCPUs only within their CPUs (:func:`place`), or not at all, with
the reason (:func:`confined`).
"""
from __future__ import annotations

from cosched.model import Domain, Host


def pins(d: Domain, host: Host) -> dict[int, tuple[int, ...]]:
    """The platform's pins of each pinned vCPU (a pin to every host CPU is none)."""
    return {i: c for i, c in d.cputune.pins if set(c) != set(host.cpus)}


def allowed(d: Domain, host: Host, pins: dict[int, tuple[int, ...]]) -> dict[int, tuple[int, ...]]:
    """The CPUs each vCPU may run on, where the platform confines it more
    narrowly than the host's CPUs: its pin (``pins``), its thread's affinity
    when first seen, and its cgroup's cpuset, all at once."""
    out = {}
    for v in d.vcpus:
        cpus = set(host.cpus)
        for limit in (pins.get(v.index), v.cpus, d.cputune.cgroup_cpus):
            if limit:
                cpus &= set(limit)
        if cpus != set(host.cpus):
            out[v.index] = tuple(sorted(cpus))
    return out


def place(d: Domain, allowed: dict[int, tuple[int, ...]], cpus: list[int]) -> list[int] | None:
    """A CPU of ``cpus`` for each vCPU of ``d``, siblings on distinct CPUs and
    each within the CPUs it is allowed (``allowed``), taking ``cpus`` in
    order where there is a choice; None when there is no such placement."""
    owner: dict[int, int] = {}                       # CPU -> position of the vCPU placed there

    def take(i: int, tried: set[int]) -> bool:      # a free CPU, else one augmenting path of a bipartite matching
        ok = [c for c in cpus if c not in tried and (allowed.get(d.vcpus[i].index) is None or
                                                    c in allowed[d.vcpus[i].index])]
        for c in [c for c in ok if c not in owner] + [c for c in ok if c in owner]:
            if c in tried:
                continue
            tried.add(c)
            if c not in owner or take(owner[c], tried):
                owner[c] = i
                return True
        return False

    if not all(take(i, set()) for i in range(len(d.vcpus))):
        return None
    at = {i: c for c, i in owner.items()}
    return [at[i] for i in range(len(d.vcpus))]


def confined(d: Domain, allowed: dict[int, tuple[int, ...]], cpus: list[int], kind: str) -> str:
    """Why a confined guest cannot be placed on ``cpus``."""
    return ("not managed: the platform confines it ("
            + ", ".join(f"vCPU {i} to CPU {','.join(map(str, c)) or 'none'}" for i, c in sorted(allowed.items()))
            + f"), and its {len(d.vcpus)} vCPUs do not fit there one per CPU within the {kind} CPUs "
            f"({','.join(map(str, cpus))}): cosched never pins a guest outside its CPUs")


def left_alone(d: Domain, pins: dict[int, tuple[int, ...]]) -> tuple[str, tuple[int, ...]] | None:
    """Why the platform's decisions leave a guest alone, and the CPUs it holds (None: they do not)."""
    realtime = sorted(set(d.cputune.realtime) | {v.index for v in d.vcpus if v.realtime})
    if realtime:
        held = tuple(sorted({c for i in realtime for c in pins.get(i, ())}))
        return (f"realtime vCPUs: vCPU {', '.join(map(str, realtime))} under SCHED_FIFO or SCHED_RR "
                "(vcpusched, or as found); never frozen, pinned or boosted"), held
    own = [pins.get(v.index, ()) for v in d.vcpus]
    if own and all(len(c) == 1 for c in own) and len({c[0] for c in own}) == len(own):
        return ("dedicated CPUs: each vCPU pinned to a CPU of its own (" +
                ", ".join(f"vCPU {v.index} on {c[0]}" for v, c in zip(d.vcpus, own)) +
                "); nothing to co-schedule"), tuple(sorted(c[0] for c in own))
    return None


def untouchable(d: Domain, host: Host) -> str | None:
    """Why the platform's decisions keep cosched off a guest whatever it
    asks (left alone, or confined where its vCPUs cannot each have a CPU),
    None when they do not. Such a guest is never given per-vCPU cgroups,
    frozen, pinned or boosted."""
    own = pins(d, host)
    alone = left_alone(d, own)
    if alone is not None:
        return alone[0]
    limits = allowed(d, host, own)
    if limits and place(d, limits, list(host.cpus)) is None:
        return confined(d, limits, list(host.cpus), "host's")
    return None
