"""The wiring: builds the real adapters and runs the daemon's threads.

Threads: ``libvirt-events`` (libvirt's event loop), ``discovery`` (resync on
events, on a vanished vCPU, and every ``resync_interval_s``), ``sampler``
(schedstat every ``sample_interval_ms``), the metrics HTTP server and the
control socket. The main thread tells systemd how it is doing (READY, STATUS,
a watchdog that is fed only while sampling and discovery are alive: see
:mod:`cosched.notify`) and waits for SIGTERM/SIGINT, then restores the host,
stops them all and exits 0. SIGHUP re-reads the configuration file and the
presets without letting go of managed guests (:meth:`Daemon.reload`).
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import fields, replace

import psutil

from cosched import __version__
from cosched.actuators.journal import Journal
from cosched.actuators.pinning import LibvirtPinner
from cosched import config as configfile
from cosched.config import Config, ConfigError
from cosched.control import ControlServer
from cosched.discovery import build_snapshot
from cosched.discovery.libvirt import LibvirtSource
from cosched.discovery.threads import thread_stat
from cosched.engine import Engine
from cosched.hostfs import HostFS
from cosched.metrics import CoschedCollector, serve
from cosched.model import Domain, Snapshot
from cosched.notify import Notifier
from cosched.policy.presets import Presets
from cosched.sampler import Sampler

log = logging.getLogger("cosched.daemon")


def _policy_text(d: Domain) -> str:
    if d.policy is None:
        return "-"
    params = " ".join(f"{k}={v}" for k, v in d.policy.params)
    return f"{d.policy.preset}({d.policy.kind}{' ' + params if params else ''})"


def log_changes(old: Snapshot | None, new: Snapshot) -> None:
    """One structured line per state change between two snapshots."""
    before = {d.uuid: d for d in old.domains} if old else {}
    after = {d.uuid: d for d in new.domains}
    for uuid, d in before.items():
        if uuid not in after:
            log.info("domain=%s action=gone", d.name)
    for uuid, d in after.items():
        prev = before.get(uuid)
        if prev is None:
            log.info("domain=%s uuid=%s pid=%s vcpus=%d policy=%s action=found", d.name, uuid, d.pid, len(d.vcpus), _policy_text(d))
        elif prev.policy != d.policy:
            log.info("domain=%s policy=%s action=policy-changed", d.name, _policy_text(d))
        if d.error and (prev is None or prev.error != d.error):
            log.warning("domain=%s action=policy-error error=%r (observed, not managed)", d.name, d.error)
        elif prev is not None and prev.error and not d.error:
            log.info("domain=%s action=policy-error-cleared", d.name)
        old_tids = {v.index: v.tid for v in prev.vcpus} if prev else {}
        for v in d.vcpus:
            if old_tids.get(v.index) != v.tid:
                log.info("domain=%s vcpu=%d tid=%d action=vcpu-found", d.name, v.index, v.tid)
        for index in set(old_tids) - {v.index for v in d.vcpus}:
            log.info("domain=%s vcpu=%d action=vcpu-gone", d.name, index)
        for w in d.warnings:
            if prev is None or w not in prev.warnings:
                log.warning("domain=%s action=vcpu-mapping warning=%r", d.name, w)
    if old is not None and old.libvirt_connected != new.libvirt_connected:
        log.info("libvirt_connected=%s action=libvirt-state", new.libvirt_connected)


# Settings a running daemon cannot take over on SIGHUP: they need a restart.
RESTART_KEYS = ("connect", "metrics_address", "state_dir", "switcher_priority")
STALL_SECONDS = 10.0      # no sample for this long: unhealthy, the watchdog is not fed


class Daemon:
    def __init__(self, config: Config, fs: HostFS | None = None, dry_run: bool = False,
                 config_path: str | None = None, overrides: dict | None = None, notifier: Notifier | None = None):
        self.config = config
        self.config_path = config_path
        self.overrides = dict(overrides or {})
        self.notifier = notifier or Notifier()
        self.fs = fs or HostFS("/")
        self.dry_run = dry_run
        self.presets = Presets.load(list(config.presets_dirs))
        for e in self.presets.errors:
            log.warning("action=preset-invalid error=%r", e)
        self.stop = threading.Event()
        self.wake = threading.Event()
        self._reload = threading.Event()
        self.snapshot: Snapshot | None = None
        self._facts: list = []
        self.source = LibvirtSource(config.connect, self.wake.set)
        self.engine = Engine(self.fs, Journal(config.journal_path),
                             LibvirtPinner(lambda: self.source.conn if self.source.connected else None),
                             reserved_cpus=config.reserved_cpus, max_stall_ms=config.max_stall_ms,
                             switcher_priority=config.switcher_priority, dry_run=dry_run)
        self.sampler = Sampler(self.fs, config.sample_interval_ms / 1000.0, lambda: self.snapshot, self.wake.set,
                               costop=self._costop)
        self.control = ControlServer(config.socket_path, self.request)
        self.started = time.time()
        self._http = None
        self._samples_seen, self._sampled_at, self._unhealthy = -1, time.monotonic(), False

    # -- discovery ------------------------------------------------------
    def resync(self) -> Snapshot:
        facts = self.source.domains()
        connected = facts is not None
        if connected:
            self._facts = facts
        # Disconnected: guests keep running without libvirtd, so keep
        # observing the last known ones (their threads are re-read from /proc).
        snap = build_snapshot(self.fs, self._facts, self.presets, self.config.default_policy, connected)
        log_changes(self.snapshot, snap)
        self.snapshot = snap
        self.engine.reconcile(snap)
        return snap

    def _costop(self) -> dict[tuple[str, int], float]:
        with self.engine.lock:
            return dict(self.engine.stats.costop)

    def reload(self) -> None:
        """SIGHUP: re-read the configuration file and the preset files.

        Managed guests stay managed throughout: the next resync replans with
        the new settings and changes only what differs. A configuration that
        does not validate is refused as a whole (logged, the running one
        kept). ``connect``, ``metrics_address``, ``state_dir`` and
        ``switcher_priority`` need a restart: a change to them is logged and
        the running value kept. Command-line options still override the file.
        """
        self.notifier.reloading()
        try:
            new = replace(configfile.load(self.config_path), **self.overrides)
        except ConfigError as e:
            log.error("action=reload-refused error=%r (the running configuration and presets stay)", str(e))
            return
        fixed = [k for k in RESTART_KEYS if getattr(new, k) != getattr(self.config, k)]
        if fixed:
            log.warning("action=reload keys=%s needs=restart (running values kept)", ",".join(fixed))
            new = replace(new, **{k: getattr(self.config, k) for k in fixed})
        changed = [f.name for f in fields(Config) if getattr(new, f.name) != getattr(self.config, f.name)]
        self.config = new
        self.sampler.interval = new.sample_interval_ms / 1000.0
        self.engine.reserved_cpus, self.engine.max_stall_ms = new.reserved_cpus, new.max_stall_ms
        self.presets = Presets.load(list(new.presets_dirs))
        log.info("action=reloaded changed=%s presets=%s errors=%d", ",".join(changed) or "-",
                 ",".join(sorted(self.presets.by_name)), len(self.presets.errors))
        for e in self.presets.errors:
            log.warning("action=preset-invalid error=%r", e)

    def _settling(self) -> bool:
        """A guest's vCPU threads are not in their own cgroups yet (QEMU just started)."""
        snap = self.snapshot
        return snap is not None and bool(snap.host.cgroup2_mount) and any(
            v.cgroup2 is None for d in snap.domains for v in d.vcpus)

    def _discovery_loop(self) -> None:
        while not self.stop.is_set():
            settle = not self.source.connected or self._settling()
            timeout = 0.5 if settle else self.config.resync_interval_s
            self.wake.wait(timeout)
            if self.stop.is_set():
                return
            self.wake.clear()
            try:
                reloaded = self._reload.is_set()
                if reloaded:
                    self._reload.clear()
                    self.reload()
                self.resync()
                if reloaded:
                    self.notifier.ready(self.summary())
            except Exception:
                log.exception("action=resync-failed")

    # -- health ---------------------------------------------------------
    def summary(self) -> str:
        """One line for systemd's STATUS=."""
        snap = self.snapshot
        doms = snap.domains if snap else ()
        managed = sum(1 for d in doms if self.engine.plan.cell_of(d.uuid))
        errors = sum(1 for d in doms if d.error or d.uuid in self.engine.plan.rejected)
        text = (f"{len(doms)} guests observed, {managed} managed, {errors} with policy errors; "
                f"libvirt {'connected' if self.source.connected else 'disconnected'}")
        return text + ("; paused by cosched reset" if self.engine.paused else "")

    def healthy(self, threads: list[threading.Thread], now: float) -> bool:
        """Worker threads alive and the sampler still sampling."""
        if self.sampler.samples != self._samples_seen:
            self._samples_seen, self._sampled_at = self.sampler.samples, now
        dead = [t.name for t in threads if not t.is_alive()]
        stalled = now - self._sampled_at > STALL_SECONDS
        if (dead or stalled) and not self._unhealthy:
            log.error("action=unhealthy dead_threads=%s sampler_stalled=%s (watchdog no longer fed)",
                      ",".join(dead) or "-", stalled)
        self._unhealthy = bool(dead or stalled)
        return not self._unhealthy

    # -- status ---------------------------------------------------------
    def request(self, what: str) -> dict:
        """Answer one control-socket request."""
        if what == "status":
            return self.status()
        if what == "reset":
            problems = self.engine.pause()
            return {"restored": not problems, "problems": problems}
        return {"error": f"unknown request {what!r}"}

    def _live_vcpu(self, d: Domain, vc) -> dict:
        """Frozen and scheduling state read now, not at the last resync."""
        host = self.snapshot.host
        freeze = host.freeze_file(vc)
        events = self.fs.read_or(freeze.rsplit("/", 1)[0] + "/cgroup.events") if freeze else None
        frozen = "frozen 1" in (events or "").splitlines() if events is not None else vc.frozen
        stat = thread_stat(self.fs, vc.tid, d.pid)
        sched, prio = (stat[0], stat[1]) if stat else (vc.sched, vc.priority)
        return {"frozen": frozen, "sched": sched, "priority": prio}

    def status(self) -> dict:
        snap = self.snapshot
        views = self.sampler.view()
        host = snap.host if snap else None
        plan = self.engine.plan
        with self.engine.lock:
            es = self.engine.stats
            costop = dict(es.costop)
            engine = {
                "paused": self.engine.paused,
                "max_stall_limit_ms": self.engine.max_stall_ms,
                "reserved_cpus": list(self.engine.reserved_cpus),
                "realtime_switcher": es.realtime,
                "switches": dict(es.switches),
                "forced_thaws": es.forced_thaws,
                "errors": list(es.errors)[-10:],
                "switch_latency_p99_seconds": es.latency.quantile(0.99),
                "slot_lateness_p99_seconds": es.lateness.quantile(0.99),
                "cells": [{"id": c.id, "mode": c.mode, "cpus": list(c.cpus), "members": [m.name for m in c.members],
                           "cycle_ms": c.cycle_ms, "max_stall_ms": c.max_stall_ms, "note": c.note,
                           "boost_failed": es.boost_failed.get(c.id),
                           "active": next((m.name for m in c.members if m.uuid == es.active.get(c.id)), None)}
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
                "policy": d.policy.preset if d.policy else None,
                "policy_kind": d.policy.kind if d.policy else None,
                "policy_source": d.policy.source if d.policy else None,
                "params": dict(d.policy.params) if d.policy else {},
                "error": d.error or plan.rejected.get(d.uuid),
                "managed": cell is not None,
                "cell": cell.id if cell else None,
                "warnings": list(d.warnings),
                "vcpus": [{
                    "index": vc.index,
                    "tid": vc.tid,
                    "cpus": list(vc.cpus),
                    **self._live_vcpu(d, vc),
                    "run_seconds": per_vcpu[vc.index].run if vc.index in per_vcpu else None,
                    "wait_seconds": per_vcpu[vc.index].wait if vc.index in per_vcpu else None,
                    "costop_seconds": costop.get((d.uuid, vc.index), 0.0),
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
            "daemon": {
                "version": __version__,
                "pid": os.getpid(),
                "uptime_seconds": time.time() - self.started,
                "cpu_seconds": sum(psutil.Process().cpu_times()[:2]),
                "dry_run": self.dry_run,
                "libvirt": {"uri": self.config.connect, "connected": self.source.connected, "error": self.source.last_error},
                "sample_interval_ms": self.config.sample_interval_ms,
                "samples": self.sampler.samples,
                "late_samples": self.sampler.late,
                "preset_errors": list(self.presets.errors),
                "engine": engine,
            },
            "domains": domains,
        }

    # -- lifecycle ------------------------------------------------------
    def run(self) -> int:
        host, port = self.config.metrics_host_port()
        self.control.start()
        try:
            self._http, _ = serve(CoschedCollector(lambda: self.snapshot, self.sampler.view, self.engine), host, port)
        except OSError as e:
            self.control.stop()
            log.error("action=metrics-listen-failed address=%s error=%r", self.config.metrics_address, e.strerror)
            return 1
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop.set())
        signal.signal(signal.SIGHUP, lambda *_: (self._reload.set(), self.wake.set()))
        self.source.ensure_connected()
        self.engine.recover()          # undo a crashed predecessor before anything else
        self.resync()
        self.control.serve()
        threads = [
            threading.Thread(target=self._discovery_loop, name="discovery", daemon=True),
            threading.Thread(target=self.sampler.run, args=(self.stop,), name="sampler", daemon=True),
        ]
        for t in threads:
            t.start()
        log.info("version=%s connect=%s metrics=%s dry_run=%s action=started", __version__, self.config.connect,
                 self.config.metrics_address, self.dry_run)
        self.notifier.ready(self.summary())
        tick = min(1.0, self.notifier.watchdog_interval or 1.0)
        while not self.stop.wait(tick):
            if self.healthy(threads, time.monotonic()):
                self.notifier.watchdog()
            self.notifier.status(self.summary())
        log.info("action=stopping")
        self.notifier.stopping()
        self.wake.set()
        for t in threads:
            t.join(timeout=5)
        problems = self.engine.release()
        self.control.stop()
        self._http.shutdown()
        self.source.close()
        log.info("action=stopped restored=%s", "all" if not problems else f"not all: {problems}")
        return 0
