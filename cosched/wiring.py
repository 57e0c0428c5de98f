"""The wiring: builds the real adapters and hands them to the daemon.

The only module that chooses concrete collaborators: the sources of guests
(the host's libvirtd, QEMU processes in /proc), the
engine with its switcher process, and the sampler, all on
the host's real filesystem root. Tests build a :class:`~cosched.daemon.Daemon`
or an :class:`~cosched.engine.Engine` from fakes instead.
"""
from __future__ import annotations

import logging
import threading

from cosched.actuators.journal import Journal
from cosched.config import Config
from cosched.daemon import Daemon, Latest
from cosched.discovery import Sources, host_sources
from cosched.discovery.libvirt import LibvirtSource
from cosched.discovery.processes import ProcessSource
from cosched.trust import Trust, user_ids
from cosched.engine import Engine
from cosched.hostfs import HostFS, raise_open_files_limit
from cosched.sampler import Sampler
from cosched.sampler.kvm import KvmStats
from cosched.sampler.meter import Meter, MeterUnavailable

log = logging.getLogger("cosched.wiring")


def build_daemon(config: Config, *, dry_run: bool = False, config_path: str | None = None,
                 overrides: dict | None = None, root: str = "/", stop: threading.Event | None = None) -> Daemon:
    fs = HostFS(root)
    try:
        before, after = raise_open_files_limit()     # for this process and the switcher it starts
        if after != before:
            log.info("action=open-files-limit old=%d new=%d", before, after)
    except OSError as e:
        log.warning("action=open-files-limit error=%r: the limit stays; past it vCPUs go unsampled", str(e))
    wake = threading.Event()
    latest = Latest()
    found = {"libvirt": lambda: LibvirtSource(config.connect, wake.set),
             "processes": lambda: ProcessSource(fs, config.pve_config_dir, trust=Trust(
                 config.emulators, user_ids(config.emulator_users)))}
    names, why = (config.sources, "configured") if config.sources else host_sources(fs)
    log.info("action=sources sources=%s reason=%r", ",".join(names), why)
    each = {name: found[name]() for name in names}
    source = Sources(each.values())
    libvirt = each.get("libvirt")
    meter, why = None, 'meter = "off" in the configuration'
    if config.meter == "auto":
        try:
            if root != "/":
                raise MeterUnavailable(f"the host's filesystem is at {root}: the meter sees only the real one")
            meter = Meter.load()
        except MeterUnavailable as e:
            why = str(e)
    if meter is not None:
        log.info("action=observe source=meter")
    else:
        log.info("action=observe source=proc reason=%r", why)
    # with the meter, while it runs, a switcher is told of boost guests' long waits
    engine = Engine(fs, Journal(config.journal_path), max_stall_ms=config.max_stall_ms,
                    switcher_priority=config.switcher_priority, dry_run=dry_run, resync=wake.set,
                    long_waits=meter.long_waits if meter is not None else lambda: None)
    sampler = Sampler(fs, config.sample_interval_ms / 1000.0, latest.get, wake.set, costop=engine.costop,
                      budget=config.sample_budget_pct / 100.0, meter=meter,
                      meter_error=None if meter is not None else why)
    kvm = KvmStats(fs, libvirt.vcpu_stats if libvirt else None)
    return Daemon(config, fs=fs, source=source, engine=engine, sampler=sampler, latest=latest, wake=wake,
                  dry_run=dry_run, config_path=config_path, overrides=overrides, kvm=kvm, stop=stop)
