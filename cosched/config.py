"""Daemon configuration: ``/etc/cosched/cosched.toml``, validated once at load.

Every key is optional; an unknown key or a value of the wrong type is an
error naming the key. Command-line options override the file. SIGHUP
re-reads it (see :meth:`cosched.daemon.Daemon.reload`); ``connect``,
``metrics_address``, ``state_dir``, ``switcher_priority``, ``sources``,
``pve_config_dir``, ``emulators``, ``emulator_users`` and ``meter`` need a restart.

``connect`` (string, default ``qemu:///system``)
    libvirt URI.
``metrics_address`` (string ``HOST:PORT``, default ``127.0.0.1:9641``)
    where Prometheus scrapes ``/metrics``.
``default_policy`` (string, default ``none``)
    the preset of guests without an annotation.
``sample_interval_ms`` (integer 1-1000, default 10)
    how often every vCPU's schedstat is read; also the skew window.
``sample_budget_pct`` (number 0.1-100, default 0.5)
    the most CPU the daemon's observation may take, in percent of one CPU
    (sampling, and what the rest of the daemon uses, which comes off first,
    down to half): on a host with many vCPUs the sampling period stretches
    beyond ``sample_interval_ms`` to stay within it (see :mod:`cosched.sampler`).
``meter`` (``auto`` or ``off``, default ``auto``)
    ``auto``: count hazard, contention and each vCPU's run, wait and frozen
    time in the kernel (a BPF program on the scheduler's switch and wake-up
    events, :mod:`cosched.sampler.meter`) where the host allows it (root,
    BTF, libbpf, the built meter): exact, and without reading ``/proc``
    each pass; the program runs on every context switch and wake-up of the
    host (0.7 µs each on the development host, where guests ran as fast
    with it as without). Where the host does not allow it, cosched samples
    ``/proc``; the log and ``cosched status`` say which is in use and why.
    With it, ``boost`` also learns of a calm guest's long waits from the
    kernel as they turn long, instead of at its next look
    (:mod:`cosched.policy.watch`). ``off``: sample ``/proc``.
``resync_interval_s`` (number 0.2-300, default 5)
    full rediscovery even without libvirt events.
``presets_dirs`` (list of strings, default ``["/etc/cosched/policies.d"]``)
    site preset directories, read after the built-in ones.
``state_dir`` (string, default ``/run/cosched``)
    the control socket and the state journal.
``reserved_cpus`` (list of integers, default ``[]``)
    host CPUs never used for co-scheduling (keep some for the host itself).
``max_stall_ms`` (integer 10-10000, default 500)
    longest time a guest may be held frozen; the planner refuses slot tables
    that would exceed it and the switcher force-thaws if it ever would.
``switcher_priority`` (integer 2-99, default 50)
    SCHED_FIFO priority of the switch loop; gang-slot boosts stay below it
    (watched boosts are SCHED_DEADLINE: above it, for at most a few ms).
``sources`` (list of ``libvirt``, ``processes``; default ``[]``: by the host)
    where guests are found: the host's libvirtd (at ``connect``), and QEMU
    processes no host libvirtd runs (Proxmox VE, KubeVirt pods, hand-started;
    see :mod:`cosched.discovery.processes`). Empty: ``["processes"]`` on a
    Proxmox VE host (``/etc/pve``) without a libvirtd socket, else
    ``["libvirt"]`` (:func:`cosched.discovery.host_sources`).
``pve_config_dir`` (string, default ``/etc/pve/qemu-server``)
    where the ``processes`` source reads a Proxmox VE guest's ``VMID.conf``
    for its ``cosched-`` tag.
``emulators`` (list of path globs, default the distribution's ``qemu-system-*``, ``qemu-kvm`` and Proxmox VE's ``kvm``)
    the executables the ``processes`` source takes for QEMU; with
    ``emulator_users`` (list of user names, default ``["libvirt-qemu", "qemu"]``;
    root always) the users it may run as (:mod:`cosched.trust`).
``flavor_policies`` (list of tables ``{flavor = GLOB, policy = PRESET}``, default ``[]``)
    OpenStack: the preset of an instance without an annotation and without a
    ``cosched:policy`` flavor extra spec, by its flavor's name (the first
    matching glob wins; see :mod:`cosched.annotation`).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from cosched.compat import tomllib
from cosched.trust import EMULATOR_USERS, EMULATORS

DEFAULT_PATH = "/etc/cosched/cosched.toml"


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class Config:
    connect: str = "qemu:///system"
    metrics_address: str = "127.0.0.1:9641"
    default_policy: str = "none"
    sample_interval_ms: int = 10
    sample_budget_pct: float = 0.5
    meter: str = "auto"
    resync_interval_s: float = 5.0
    presets_dirs: tuple[str, ...] = ("/etc/cosched/policies.d",)
    state_dir: str = "/run/cosched"
    reserved_cpus: tuple[int, ...] = ()
    max_stall_ms: int = 500
    switcher_priority: int = 50
    sources: tuple[str, ...] = ()                  # empty: by the host (discovery.host_sources)
    pve_config_dir: str = "/etc/pve/qemu-server"
    flavor_policies: tuple[tuple[str, str], ...] = ()
    emulators: tuple[str, ...] = EMULATORS
    emulator_users: tuple[str, ...] = EMULATOR_USERS

    @property
    def socket_path(self) -> str:
        return f"{self.state_dir}/cosched.sock"

    @property
    def journal_path(self) -> str:
        return f"{self.state_dir}/journal.json"

    def metrics_host_port(self) -> tuple[str, int]:
        return parse_address(self.metrics_address, "metrics_address")


def parse_address(text: str, key: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{key}: expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


SOURCES = ("libvirt", "processes")
METER_MODES = ("auto", "off")
_RANGES = {"sample_interval_ms": (1, 1000), "sample_budget_pct": (0.1, 100), "resync_interval_s": (0.2, 300), "max_stall_ms": (10, 10000),
           "switcher_priority": (2, 99)}


def _flavor_rules(key: str, value: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or not all(
            isinstance(r, dict) and set(r) == {"flavor", "policy"} and all(isinstance(v, str) and v for v in r.values())
            for r in value):
        raise ConfigError(f"{key}: expected a list of tables {{flavor = \"GLOB\", policy = \"PRESET\"}}, "
                          f"got {value!r}")
    return tuple((r["flavor"], r["policy"]) for r in value)


def _check(key: str, value: object, default: object) -> object:
    if key == "flavor_policies":
        return _flavor_rules(key, value)
    if isinstance(default, tuple):
        item = int if key == "reserved_cpus" else str
        if not isinstance(value, list) or not all(isinstance(v, item) and not isinstance(v, bool) for v in value):
            raise ConfigError(f"{key}: expected a list of {item.__name__}s, got {value!r}")
        if item is int and any(v < 0 for v in value):
            raise ConfigError(f"{key}: CPU numbers cannot be negative")
        if key == "emulators" and not all(v.startswith("/") for v in value):
            raise ConfigError(f"{key}: expected absolute paths (globs allowed), got {value!r}")
        if key == "sources":
            bad = [v for v in value if v not in SOURCES]
            if bad or len(set(value)) != len(value):
                raise ConfigError(f"{key}: expected one or both of {', '.join(SOURCES)}, each once, got {value!r}")
        return tuple(value)
    if key == "meter" and value not in METER_MODES:
        raise ConfigError(f"{key}: expected one of {', '.join(METER_MODES)}, got {value!r}")
    if isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        ok = isinstance(value, type(default)) and not (isinstance(value, bool) and not isinstance(default, bool))
    if not ok:
        raise ConfigError(f"{key}: expected {type(default).__name__}, got {value!r}")
    if key in _RANGES:
        lo, hi = _RANGES[key]
        if not lo <= value <= hi:
            raise ConfigError(f"{key}: {value} is outside {lo}..{hi}")
    return float(value) if isinstance(default, float) else value


def from_dict(data: dict) -> Config:
    defaults = Config()
    known = {f.name for f in fields(Config)}
    values = {}
    for key, value in data.items():
        if key not in known:
            raise ConfigError(f"unknown key {key!r} (known: {', '.join(sorted(known))})")
        values[key] = _check(key, value, getattr(defaults, key))
    config = replace(defaults, **values)
    config.metrics_host_port()
    return config


def load(path: str | None) -> Config:
    """Load ``path``; no path and no default file means all defaults."""
    import os

    if path is None:
        if not os.path.exists(DEFAULT_PATH):
            return Config()
        path = DEFAULT_PATH
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: {e}") from None
    try:
        return from_dict(data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
