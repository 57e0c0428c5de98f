"""Human views of the daemon's documents: ``cosched status`` and ``cosched explain``.

Pure text from the JSON the control socket returns (docs/reference/status.md);
nothing here talks to the daemon or the host.
"""
from __future__ import annotations


def _pct(part: float, whole: float) -> str:
    """A percentage, capped at 100: the kernel credits a wait only when it ends,
    so a long wait can land in one short interval."""
    return f"{min(100.0 * part / whole, 100.0):5.1f}" if whole > 0 else "    -"


def render(status: dict, previous: dict | None = None) -> str:
    """A human view of a status document; with ``previous``, rates between the two.

    RUN% and WAIT% are each vCPU's share of the interval spent running and
    waiting for a host CPU; HAZARD% is the share of time one vCPU of the guest
    ran while a sibling waited; SKEW is the mean per-window skew (since the
    daemon started, or over the interval with ``previous``).
    """
    d = status["daemon"]
    host = status["host"]
    width = max([16] + [len(dom["name"]) for dom in status["domains"]])
    lines = [
        f"cosched {d['version']}  libvirt {d['libvirt']['uri']} "
        f"{'connected' if d['libvirt']['connected'] else 'DISCONNECTED'}  host cpus {host['cpus']}  "
        f"cgroup {host['cgroup']}{'  DRY-RUN' if d['dry_run'] else ''}",
        f"{'DOMAIN':<{width}} {'POLICY':<12} {'VCPU':>4} {'TID':>8} {'CPUS':<8} {'SCHED':<6} {'FRZ':<3} "
        f"{'RUN%':>5} {'WAIT%':>5} {'HAZARD%':>7} {'SKEW ms':>7}",
    ]
    before = {x["uuid"]: x for x in previous["domains"]} if previous else {}
    for dom in status["domains"]:
        old = before.get(dom["uuid"])
        span = dom["observed_seconds"] - (old["observed_seconds"] if old else 0.0)
        hazard = dom["hazard_seconds"] - (old["hazard_seconds"] if old else 0.0)
        old_vcpus = {v["index"]: v for v in old["vcpus"]} if old else {}
        policy = dom["policy"] or "INVALID"
        if dom.get("mode") and dom.get("policy_kind") == "auto":
            policy = f"auto:{dom['mode']}"
        skew = f"{1000 * dom['skew_mean_seconds']:.2f}"
        if old and dom.get("skew_windows", 0) > old.get("skew_windows", 0):
            skew = f"{1000 * (dom['skew_sum_seconds'] - old['skew_sum_seconds']) / (dom['skew_windows'] - old['skew_windows']):.2f}"
        for i, v in enumerate(dom["vcpus"]):
            ov = old_vcpus.get(v["index"]) if old_vcpus.get(v["index"], {}).get("tid") == v["tid"] else None
            run = (v["run_seconds"] or 0.0) - ((ov or {}).get("run_seconds") or 0.0)
            wait = (v["wait_seconds"] or 0.0) - ((ov or {}).get("wait_seconds") or 0.0)
            rates = (_pct(run, span), _pct(wait, span)) if ov else ("    -", "    -")
            first = i == 0
            lines.append(
                f"{dom['name'] if first else '':<{width}} {policy if first else '':<12} {v['index']:>4} {v['tid']:>8} "
                f"{','.join(map(str, v['cpus'])):<8} {v['sched']:<6} {'yes' if v['frozen'] else 'no':<3} "
                f"{rates[0]:>5} {rates[1]:>5} "
                f"{(_pct(hazard, span) if first else ''):>7} {(skew if first else ''):>7}"
            )
        if not dom["vcpus"]:
            lines.append(f"{dom['name']:<{width}} {policy:<12} (no vCPU threads found)")
        if dom["error"]:
            lines.append(f"{'':<{width}} error: {dom['error']}")
    if not status["domains"]:
        lines.append("(no running domains)")
    return "\n".join(lines)


def render_explain(e: dict) -> str:
    """A human view of ``cosched explain``: evidence, scores, decision."""
    if e.get("left_alone"):
        return (f"domain {e['domain']}: mode none, left alone (policy {e.get('policy')})\n"
                f"  why: {e['left_alone']}")
    if "why" in e:
        lines = [f"domain {e['domain']}: mode {e['mode'] or 'none (not managed)'} (policy {e.get('policy')})",
                 f"  why: {e['why']}"]
    else:
        lines = [f"domain {e['domain']}: mode {e['mode']} (auto, allowed: {', '.join(e['allow'])})",
                 f"  decision: {e['reason']}"]
    for mode, reason in (e.get("refused") or {}).items():
        lines.append(f"  chosen {e.get('chosen', mode)}; the planner cannot take {mode}: {reason}")
    sig = e.get("signals") or {}
    if sig.get("contention") is not None:
        lines.append(f"  evidence (smoothed): contention {sig['contention']:.2f} (waiting or co-stopped share of "
                     f"wanted vCPU time), idleness {sig['idleness']:.2f} (idle share of vCPU time neither waiting nor co-stopped), "
                     f"spread {sig.get('spread') or 0.0:.2f} (most idle vCPU's idleness less the busiest's), "
                     f"hazard {sig['hazard_per_second']:.2f} s/s, busy {sig.get('busy') or 0.0:.2f} vCPUs' worth")
    if sig.get("spins_per_run_second") is not None:
        lines.append(f"  KVM (smoothed): {sig['spins_per_run_second']:.0f} directed-yield attempts per second of vCPU run "
                     "time (a vCPU spinning with PAUSE makes thousands)")
    elif sig.get("contention") is not None:
        lines.append("  KVM: no spin counters for this guest (TCG, or neither libvirt nor debugfs reports them)")
    w = e.get("last_window")
    if w:
        lines.append(f"  last window: {w['seconds']:.2f} s x {w['vcpus']} vCPUs: run {w['run']:.2f} s, wait "
                     f"{w['wait']:.2f} s, co-stopped {w['costop']:.2f} s, idle {w['idle']:.2f} s, "
                     f"hazard {w['hazard']:.2f} s")
    if e.get("scores"):
        lines.append("  scores: " + "  ".join(f"{m} {s:.2f}{' *' if m == e['mode'] else ''}"
                                              for m, s in sorted(e["scores"].items(), key=lambda kv: -kv[1])))
    if e.get("hosted"):
        lines.append("  left to the host scheduler but busy: it runs in the turn the hosted guests share beside the "
                     "gang guests, frozen in theirs, so that it does not take their CPUs")
    host = e.get("host")
    if host:
        lines.append("host:")
        for c in host["cells"]:
            turns: dict[int, list[str]] = {}
            for i, s in enumerate(c["slots"]):
                turns.setdefault(s.get("turn", i), []).append(
                    f"{s['domain']} ({s['mode']}{', hosted' if s['hosted'] else ''}, {s['slot_ms']:g} ms"
                    + (f", hazard {s['hazard_per_second']:.2f} s/s" if s.get("hazard_per_second") is not None
                       else "") + ")")
            slots = ", ".join(" + ".join(t) for t in turns.values())
            lines.append(f"  cell {c['cell']} ({c['kind']}, CPUs {','.join(map(str, c['cpus'])) or 'any'}, "
                         f"cycle {c['cycle_ms']:g} ms): {slots}" + (f"; {c['note']}" if c.get("note") else ""))
        if host.get("free"):
            lines.append(f"  free under the host scheduler: {', '.join(host['free'])}")
    return "\n".join(lines)
