"""What the daemon reports, as pure functions of what it knows.

:func:`changes` turns two successive snapshots into structured log lines
(state changes only); :func:`document` builds the ``cosched status --json``
document (contract: ``host``, ``domains`` with ``name``, ``uuid``, ``pid``,
``policy``, ``error`` and ``vcpus``; extra keys allowed). Neither reads the
host: the daemon gathers the inputs and calls them, tests call them directly.
"""
from __future__ import annotations

import logging
from typing import Mapping

from cosched.model import Domain, Snapshot
from cosched.policy.plan import Plan
from cosched.policy.watch import HELD

INFO, WARNING = logging.INFO, logging.WARNING


def policy_text(d: Domain) -> str:
    if d.policy is None:
        return "-"
    params = " ".join(f"{k}={v}" for k, v in d.policy.params)
    return f"{d.policy.preset}({d.policy.kind}{' ' + params if params else ''})"


def changes(old: Snapshot | None, new: Snapshot) -> list[tuple[int, str]]:
    """(log level, structured line) for each state change between two snapshots."""
    out: list[tuple[int, str]] = []
    before = {d.uuid: d for d in old.domains} if old else {}
    after = {d.uuid: d for d in new.domains}
    for uuid, d in before.items():
        if uuid not in after:
            out.append((INFO, f"domain={d.name} action=gone"))
    for uuid, d in after.items():
        prev = before.get(uuid)
        if prev is None:
            out.append((INFO, f"domain={d.name} uuid={uuid} pid={d.pid} vcpus={len(d.vcpus)} "
                              f"policy={policy_text(d)} action=found"))
        elif prev.policy != d.policy:
            out.append((INFO, f"domain={d.name} policy={policy_text(d)} action=policy-changed"))
        if d.error and (prev is None or prev.error != d.error):
            out.append((WARNING, f"domain={d.name} action=policy-error error={d.error!r} (observed, not managed)"))
        elif prev is not None and prev.error and not d.error:
            out.append((INFO, f"domain={d.name} action=policy-error-cleared"))
        old_tids = {v.index: v.tid for v in prev.vcpus} if prev else {}
        for v in d.vcpus:
            if old_tids.get(v.index) != v.tid:
                out.append((INFO, f"domain={d.name} vcpu={v.index} tid={v.tid} action=vcpu-found"))
        for index in sorted(set(old_tids) - {v.index for v in d.vcpus}):
            out.append((INFO, f"domain={d.name} vcpu={index} action=vcpu-gone"))
        for w in d.warnings:
            if prev is None or w not in prev.warnings:
                out.append((WARNING, f"domain={d.name} action=vcpu-mapping warning={w!r}"))
    if old is not None and old.libvirt_connected != new.libvirt_connected:
        out.append((INFO, f"libvirt_connected={new.libvirt_connected} action=libvirt-state"))
    return out


def summary(snap: Snapshot | None, plan: Plan, connected: bool, paused: bool) -> str:
    """One line for systemd's ``STATUS=``."""
    doms = snap.domains if snap else ()
    managed = sum(1 for d in doms if plan.cell_of(d.uuid))
    errors = sum(1 for d in doms if d.error or d.uuid in plan.rejected)
    text = (f"{len(doms)} guests observed, {managed} managed, {errors} with policy errors; "
            f"libvirt {'connected' if connected else 'disconnected'}")
    return text + ("; paused by cosched reset" if paused else "")


def document(snap: Snapshot | None, views: Mapping, plan: Plan, stats, live: Mapping[tuple[str, int], dict],
             daemon: dict, engine: dict, modes: Mapping[str, str] = {}) -> dict:
    """The status document.

    ``modes``: the mode in force per managed guest, by uuid (for ``auto``,
    its choice or what the planner took instead: :meth:`cosched.daemon.Daemon.modes`).
    ``views``: the sampler's per-domain figures by uuid; ``stats``: the
    engine's :class:`~cosched.switcher.protocol.Stats`; ``live``: per (uuid, vCPU
    index) the state read just now (``frozen``, ``sched``, ``priority``);
    ``daemon`` and ``engine``: settings and health, copied in as they are.
    """
    host = snap.host if snap else None
    engine = {
        **engine,
        "realtime_switcher": stats.realtime,
        "pool": list(plan.pool),
        "switches": dict(stats.switches),
        "forced_thaws": stats.forced_thaws,
        "long_waits_held": {why: stats.long_waits_held.get(why, 0) for why in HELD},
        "long_waits_reported": stats.long_waits_reported,
        "errors": list(stats.errors)[-10:],
        "switch_latency_p99_seconds": stats.latency.quantile(0.99),
        "slot_lateness_p99_seconds": stats.lateness.quantile(0.99),
        "cells": [{"id": c.id, "mode": c.mode, "cpus": list(c.cpus), "members": [m.name for m in c.members],
                   "cycle_ms": c.cycle_ms, "max_stall_ms": c.max_stall_ms, "note": c.note,
                   "boost_failed": stats.boost_failed.get(c.id),
                   "active": next((m.name for m in c.members if m.uuid == stats.active.get(c.id)), None)}
                  for c in plan.cells],
    }
    domains = []
    for d in snap.domains if snap else ():
        v = views.get(d.uuid)
        per_vcpu = {vc.index: vc for vc in v.vcpus} if v else {}
        cell = plan.cell_of(d.uuid)
        domains.append({
            "name": d.name,
            "uuid": d.uuid,
            "pid": d.pid,
            "source": d.source,
            "policy": d.policy.preset if d.policy else None,
            "policy_kind": d.policy.kind if d.policy else None,
            "policy_source": d.policy.source if d.policy else None,
            "params": dict(d.policy.params) if d.policy else {},
            "error": d.error or plan.rejected.get(d.uuid),
            "managed": cell is not None,
            "mode": modes.get(d.uuid),
            "cell": cell.id if cell else None,
            "hosted": cell is not None and plan.member(d.uuid).hosted,
            "left_alone": plan.left_alone.get(d.uuid),
            "confined": {str(i): list(c) for i, c in plan.confined[d.uuid].items()} if d.uuid in plan.confined else None,
            "emulator_cpus": list(d.cputune.emulator) if d.cputune.emulator else None,
            "warnings": list(d.warnings),
            "vcpus": [{
                "index": vc.index,
                "tid": vc.tid,
                **live.get((d.uuid, vc.index), {"cpus": list(vc.cpus), "frozen": vc.frozen, "sched": vc.sched,
                                                "priority": vc.priority}),
                "run_seconds": per_vcpu[vc.index].run if vc.index in per_vcpu else None,
                "wait_seconds": per_vcpu[vc.index].wait if vc.index in per_vcpu else None,
                "costop_seconds": stats.costop.get((d.uuid, vc.index), 0.0),
                "costops": stats.costops.get((d.uuid, vc.index), 0),
                "boosts": stats.boosts.get((d.uuid, vc.index), 0),
            } for vc in d.vcpus],
            "observed_seconds": v.observed if v else 0.0,
            "hazard_seconds": v.hazard if v else 0.0,
            "partial_contention_seconds": v.partial if v else 0.0,
            "skew_last_seconds": v.last_skew if v else 0.0,
            "skew_mean_seconds": (v.skew_sum / v.skew_count) if v and v.skew_count else 0.0,
            "skew_sum_seconds": v.skew_sum if v else 0.0,
            "skew_windows": v.skew_count if v else 0,
        })
    return {
        "host": {
            "cpus": list(host.cpus) if host else [],
            "cgroup": host.cgroup if host else None,
            "cgroup2_mount": host.cgroup2_mount if host else None,
            "cores": [list(c) for c in host.cores] if host else [],
            "nodes": list(host.nodes) if host else [],
        },
        "daemon": {**daemon, "engine": engine},
        "domains": domains,
    }
