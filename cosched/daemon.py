"""The daemon: runs discovery, sampling and the engine in their threads.

Threads: ``libvirt-events`` (libvirt's event loop), ``discovery`` (resync on
events, when a vCPU thread is gone, and every ``resync_interval_s``), ``sampler``
(schedstat every ``sample_interval_ms``), the metrics HTTP server and the
control socket. The main thread tells systemd how it is doing (READY, STATUS,
a watchdog that is fed only while sampling and discovery are alive: see
:mod:`cosched.notify`) and waits for SIGTERM/SIGINT, then restores the host,
stops them all and exits 0. SIGHUP re-reads the configuration file and the
presets without letting go of managed guests (:meth:`Daemon.reload`).

Its collaborators (libvirt source, engine, sampler) are built by
:mod:`cosched.wiring` and passed in.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import fields, replace


from cosched import __version__
from cosched import config as configfile
from cosched import status as report
from cosched.config import Config, ConfigError
from cosched.control import ControlServer
from cosched.discovery import build_snapshot
from cosched.discovery.threads import Placed, live_state
from cosched.hostfs import HostFS
from cosched.metrics import CoschedCollector, serve
from cosched.model import Snapshot
from cosched.notify import Notifier
from cosched.policy.auto import DECIDE_S, Auto
from cosched.policy.plan import PlanConfig, pool_order
from cosched.policy.presets import Presets
from cosched.policy.resolve import resolve

log = logging.getLogger("cosched.daemon")


class Latest:
    """The newest snapshot: discovery replaces it whole, every other thread reads it."""

    def __init__(self):
        self.snapshot: Snapshot | None = None

    def get(self) -> Snapshot | None:
        return self.snapshot


# Settings a running daemon cannot take over on SIGHUP: they need a restart.
RESTART_KEYS = ("connect", "metrics_address", "state_dir", "switcher_priority", "sources", "pve_config_dir", "meter",
                "emulators", "emulator_users")
STALL_SECONDS = 10.0      # no sample for this long: unhealthy, the watchdog is not fed


class Daemon:
    def __init__(self, config: Config, *, fs: HostFS, source, engine, sampler, latest: Latest,
                 wake: threading.Event, dry_run: bool = False, config_path: str | None = None,
                 overrides: dict | None = None, notifier: Notifier | None = None, kvm=None,
                 stop: threading.Event | None = None):
        self.config = config
        self.config_path = config_path
        self.overrides = dict(overrides or {})
        self.notifier = notifier or Notifier()
        self.fs = fs
        self.dry_run = dry_run
        self.presets = Presets.load(list(config.presets_dirs))
        for e in self.presets.errors:
            log.warning("action=preset-invalid error=%r", e)
        self.stop = stop or threading.Event()      # set by SIGTERM/SIGINT, from the command's first lines
        self.wake = wake
        self._reload = threading.Event()
        self.latest = latest
        self.source = source
        self.engine = engine
        self.sampler = sampler
        self.kvm = kvm                         # KVM's spin and halt counters (KvmStats), or None
        self.control = ControlServer(config.socket_path, self.request)
        self.started = time.time()
        self._http = None
        self._samples_seen, self._sampled_at, self._unhealthy = -1, time.monotonic(), False
        self.auto = Auto()
        self.auto_lock = threading.RLock()     # decisions (main thread) and resyncs (discovery) replan in turn
        self.last_resync_s: float | None = None
        self.placed = Placed()                 # vCPU threads known to be in their own cgroups

    @property
    def snapshot(self) -> Snapshot | None:
        return self.latest.snapshot

    # -- discovery ------------------------------------------------------
    def resync(self) -> Snapshot:
        started = time.monotonic()
        facts = self.source.domains()       # a source that cannot answer gives its last known guests
        snap = build_snapshot(self.fs, facts, self.presets, self.config.default_policy, self.source.connected,
                              self.config.flavor_policies, self.placed)
        for level, line in report.changes(self.snapshot, snap):
            log.log(level, line)
        self.latest.snapshot = snap
        self._reconcile(snap)
        self.last_resync_s = time.monotonic() - started
        return snap

    def reload(self) -> None:
        """SIGHUP: re-read the configuration file and the preset files.

        Managed guests stay managed throughout: the next resync replans with
        the new settings and changes only what differs. A configuration that
        does not validate is refused as a whole (logged, the running one
        kept). ``connect``, ``metrics_address``, ``state_dir``,
        ``switcher_priority``, ``sources``, ``pve_config_dir``, ``emulators``, ``emulator_users`` and ``meter``
        need a restart: a change to them is logged and the running value kept. Command-line options still override the file.
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
        self.sampler.reconfigure(new.sample_interval_ms / 1000.0, new.sample_budget_pct / 100.0)
        self.engine.reconfigure(new.max_stall_ms)
        self.presets = Presets.load(list(new.presets_dirs))
        log.info("action=reloaded changed=%s presets=%s errors=%d", ",".join(changed) or "-",
                 ",".join(sorted(self.presets.by_name)), len(self.presets.errors))
        for e in self.presets.errors:
            log.warning("action=preset-invalid error=%r", e)

    def _vcpus_unplaced(self) -> bool:
        """A guest's vCPU threads are not in their own cgroups yet (QEMU just started)."""
        snap = self.snapshot
        return snap is not None and bool(snap.host.cgroup2_mount) and any(
            v.cgroup2 is None for d in snap.domains for v in d.vcpus)

    def _discovery_loop(self) -> None:
        while not self.stop.is_set():
            soon = not self.source.connected or self._vcpus_unplaced()
            timeout = 0.5 if soon else self.config.resync_interval_s
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

    # -- auto -----------------------------------------------------------
    def decide(self) -> None:
        """One decision for every guest under ``auto``; replan if a mode changed."""
        snap = self.snapshot
        if snap is None:
            return
        # the pool of the last plan: less the CPUs dedicated and realtime guests hold
        pool = len(self.engine.plan.pool or pool_order(snap.host, self.config.reserved_cpus))
        under_auto = any(d.policy is not None and d.policy.kind == "auto" for d in snap.domains)
        kvm = self.kvm.read(snap) if self.kvm is not None and under_auto else {}
        with self.auto_lock:
            if self.auto.step(time.monotonic(), snap, self.sampler.view(), self.engine.costop(), pool, kvm):
                self._reconcile(snap)

    def plan_config(self) -> PlanConfig:
        """The planner's settings, from the configuration in force."""
        c = self.config
        return PlanConfig(reserved_cpus=tuple(c.reserved_cpus), max_stall_ms=c.max_stall_ms,
                          switcher_priority=c.switcher_priority)

    def _reconcile(self, snap: Snapshot) -> None:
        """Plan ``snap`` with each auto guest under its mode in force; log every change of it."""
        with self.auto_lock:
            hosted = set(self.auto.hosted)
            resolved = resolve(snap, self.plan_config(), self.auto)
            for name, old, new, why in resolved.changes:
                log.info("domain=%s action=mode old=%s new=%s reason=%r", name, old, new, why)
            now = self.engine.reconcile(resolved.snapshot, resolved.plan)
            for d in snap.domains:
                if (d.uuid in hosted) != (d.uuid in self.auto.hosted):
                    slot = "shared" if now.cell_of(d.uuid) else "free"
                    log.info("domain=%s action=%s slot=%s", d.name,
                             "hosted" if d.uuid in self.auto.hosted else "unhosted", slot)

    def modes(self) -> dict[str, str]:
        """The mode in force per guest, from the plan the engine runs (so that
        status never shows a mode beside a plan that does not have it yet):
        its cell's kind; ``none`` for a guest ``auto`` leaves to the host."""
        snap, plan = self.snapshot, self.engine.plan
        out = {}
        for d in snap.domains if snap else ():
            mode = plan.mode_of(d.uuid)
            if mode is None and d.uuid in plan.left_alone or (
                    mode is None and d.policy is not None and d.policy.kind == "auto" and d.uuid not in plan.rejected):
                mode = "none"
            if mode is not None:
                out[d.uuid] = mode
        return out

    def explain(self, name: str) -> dict:
        """``cosched explain NAME``: why the guest runs as it does. Under
        auto: the evidence, scores and decision; otherwise what its policy
        asks and what the plan made of it (its cell and slot, or why it is
        not managed); for any guest, the host's composition."""
        d = self.snapshot.domain(name) if self.snapshot else None
        if d is None:
            return {"error": f"no domain named {name!r} is running"}
        plan = self.engine.plan
        if d.uuid in plan.left_alone:
            return {"domain": name, "mode": "none", "left_alone": plan.left_alone[d.uuid],
                    "policy": d.policy.preset if d.policy else None}
        if d.policy is None or d.policy.kind != "auto":
            return {"domain": name, "policy": d.policy.preset if d.policy else None,
                    "mode": plan.mode_of(d.uuid), "why": self._why(d), "host": self._host()}
        got = self.auto.explain(d.uuid)
        host = self._host()
        if got is None:
            return {"domain": name, "mode": "none", "chosen": "none", "refused": {}, "reason": "no evidence yet",
                    "scores": {}, "signals": {}, "last_window": None, "allow": list(dict(d.policy.params)["allow"]),
                    "hosted": False, "host": host}
        return {"domain": name, "allow": list(dict(d.policy.params)["allow"]), **got, "host": host}

    def _why(self, d) -> str:
        """Why a guest not under auto runs as it does."""
        plan = self.engine.plan
        if d.error:
            return f"not managed: its policy is invalid: {d.error}"
        if d.uuid in plan.rejected:
            return plan.rejected[d.uuid]
        cell = plan.cell_of(d.uuid)
        if cell is None:
            return ("policy none: observed, never frozen, pinned or boosted" if d.policy.kind == "none" else
                    "not planned yet (its vCPU threads are still being found)")
        if cell.kind in ("gang", "partial"):
            member = plan.member(d.uuid)
            return (f"{cell.kind}: takes its turn in cell {cell.id} (CPUs {','.join(map(str, cell.cpus))}): a slot "
                    f"of {member.slot_ms} ms in a cycle of {cell.cycle_ms} ms, frozen in the others' slots"
                    + (f"; {cell.note}" if cell.note else ""))
        return f"{cell.kind}: watched on its own by the switcher" + (f"; {cell.note}" if cell.note else "")

    def _host(self) -> dict:
        """The host's composition: each cell's slots in turn, and auto's guests left free."""
        plan = self.engine.plan
        cells = plan.composition()
        for c in cells:                        # what each auto guest in a rotation suffers: its vCPUs apart
            for slot in c["slots"]:
                ch = self.auto.chooser.guests.get(slot["uuid"])
                slot["hazard_per_second"] = ch.hazard if ch is not None else None
        return {"cells": cells,
                "free": sorted(x.name for x in self.snapshot.domains if x.uuid in self.auto.in_force
                               and plan.cell_of(x.uuid) is None)}

    # -- health ---------------------------------------------------------
    def summary(self) -> str:
        """One line for systemd's STATUS=."""
        return report.summary(self.snapshot, self.engine.plan, self.source.connected, self.engine.paused)

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

    def health(self) -> dict:
        """The daemon's own health, for metrics."""
        return {"libvirt_connected": self.source.connected, "samples": self.sampler.samples,
                "late_samples": self.sampler.late, "sample_period": self.sampler.period,
                "preset_errors": len(self.presets.errors),
                "switcher_realtime": self.engine.stats().realtime, "healthy": not self._unhealthy,
                "observation": self.sampler.source,
                "ignored_processes": self.source.ignored() if hasattr(self.source, "ignored") else {}}

    # -- status ---------------------------------------------------------
    def request(self, what: str) -> dict:
        """Answer one control-socket request."""
        if what == "status":
            return self.status()
        if what == "reset":
            problems = self.engine.pause()
            return {"restored": not problems, "problems": problems}
        if what.startswith("explain "):
            return self.explain(what.removeprefix("explain ").strip())
        return {"error": f"unknown request {what!r}"}

    def status(self) -> dict:
        snap = self.snapshot
        live = {}
        if snap is not None:
            live = {(d.uuid, v.index): live_state(self.fs, snap.host.cgroup2_mount, v, d.pid)
                    for d in snap.domains for v in d.vcpus}
        daemon = {
            "version": __version__,
            "pid": os.getpid(),
            "uptime_seconds": time.time() - self.started,
            "cpu_seconds": sum(os.times()[:2]),           # user and system
            "dry_run": self.dry_run,
            "libvirt": {"uri": self.config.connect, "connected": self.source.connected, "error": self.source.last_error},
            "sample_interval_ms": self.config.sample_interval_ms,
            "sample_period_ms": 1000 * self.sampler.period,
            "observation": {"source": self.sampler.source, "why": self.sampler.meter_error},
            "samples": self.sampler.samples,
            "late_samples": self.sampler.late,
            "last_resync_seconds": self.last_resync_s,
            "preset_errors": list(self.presets.errors),
        }
        engine = {"paused": self.engine.paused, "max_stall_limit_ms": self.engine.max_stall_ms,
                  "reserved_cpus": list(self.config.reserved_cpus)}
        return report.document(snap, self.sampler.view(), self.engine.plan, self.engine.stats(), live, daemon, engine,
                               self.modes())

    # -- lifecycle ------------------------------------------------------
    def run(self) -> int:
        """Recover what a killed predecessor left (first: it is what holds
        guests pinned and unmanaged), then serve until SIGTERM or SIGINT. A
        signal at any point of start-up ends the daemon in order: what was
        recovered or written is restored, and it exits 0."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop.set())
        self.source.ensure_connected()   # libvirt gives back the pinning a predecessor changed
        self.engine.recover()            # undo a crashed predecessor before anything else
        if self.stop.is_set():
            log.info("action=stopped-while-starting restored=%s", "all" if not self.engine.release() else "not all")
            return 0
        host, port = self.config.metrics_host_port()
        self.control.start()
        try:
            self._http, _ = serve(CoschedCollector(self.latest.get, self.sampler.view, self.engine, self.health,
                                                   self.modes), host, port)
        except OSError as e:
            self.control.stop()
            log.error("action=metrics-listen-failed address=%s error=%r", self.config.metrics_address, e.strerror)
            return 1
        signal.signal(signal.SIGHUP, lambda *_: (self._reload.set(), self.wake.set()))
        if not self.stop.is_set():
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
        tick = min(DECIDE_S, self.notifier.watchdog_interval or DECIDE_S)
        decided = time.monotonic()
        while not self.stop.wait(tick):
            now = time.monotonic()
            if self.healthy(threads, now):
                self.notifier.watchdog()
            self.notifier.status(self.summary())
            if now - decided >= DECIDE_S * 0.95:
                decided = now
                try:
                    self.decide()
                except Exception:
                    log.exception("action=decide-failed")
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
