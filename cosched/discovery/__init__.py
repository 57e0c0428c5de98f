"""Discovery: the only code that reads libvirt, /proc and /sys to build the model.

``host`` reads the CPU topology and cgroup layout, ``threads`` maps a QEMU
process's threads to vCPU indexes, ``libvirt`` keeps a connection to the
host's libvirtd with events and reconnects, ``processes`` finds the QEMU
processes no host libvirtd runs (``qemu`` reads their command lines), and
:func:`build_snapshot` ties them into a :class:`~cosched.model.Snapshot`.

Every source hands :func:`build_snapshot` the same :class:`DomainFacts`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

from cosched.annotation import AnnotationError, domain_policy, tag_policy
from cosched.discovery.host import read_host, rt_budget
from cosched.discovery.threads import Placed, find_qemu_pid, vcpu_threads
from cosched.hostfs import HostFS, parse_cpu_list
from cosched.discovery.cputune import parse_cputune
from cosched.model import CpuTune, Domain, Host, Snapshot, Vcpu
from cosched.policy.params import ParamError
from cosched.policy.presets import Presets


@dataclass(frozen=True)
class DomainFacts:
    """What a source knows of one running guest.

    The policy request is the domain XML's annotation (``xml``: the host
    libvirtd's domain, or the status file of a private libvirtd) or, for a
    Proxmox VE guest, its configuration's ``tags``; with neither, the default
    policy. ``pid``: the QEMU process when the source knows it (else it is
    looked up by name and UUID); ``source``: ``libvirt`` for the host
    libvirtd's guests, ``qemu`` for processes found in /proc; ``qmp``: what
    QEMU said of its vCPU threads, ``(index, thread id)`` pairs, when asked.
    """

    name: str
    uuid: str
    xml: str = ""
    pid: int | None = None
    source: str = "libvirt"
    tags: tuple[str, ...] | None = None
    qmp: tuple[tuple[int, int], ...] | None = None


def build_domain(fs: HostFS, host: Host, facts: DomainFacts, presets: Presets, default_preset: str,
                 flavors: tuple[tuple[str, str], ...] = (), placed: Placed | None = None) -> Domain:
    """One domain of the model from a source's facts and /proc (``flavors``:
    the ``flavor_policies`` rules for OpenStack instances)."""
    error = None
    policy = None
    try:
        if facts.tags is not None:
            policy = tag_policy(facts.tags, presets, default_preset)
        else:
            policy = domain_policy(facts.xml or "<domain/>", presets, default_preset, flavors)
    except (AnnotationError, ParamError) as e:
        error = str(e)
    pid = facts.pid or find_qemu_pid(fs, facts.name, facts.uuid)
    vcpus, warnings = vcpu_threads(fs, pid, host.cgroup2_mount, dict(facts.qmp or ()), placed) if pid else ((), ())
    vcpus = tuple(_with_cgroup_mates(fs, host, v) for v in vcpus)
    cputune = parse_cputune(facts.xml, len(vcpus)) if facts.xml else CpuTune()
    cputune = replace(cputune, cgroup_cpus=_cgroup_cpus(fs, host, vcpus))
    return Domain(name=facts.name, uuid=facts.uuid, pid=pid, vcpus=vcpus, policy=policy, error=error,
                  warnings=warnings, source=facts.source, cputune=cputune)


def _cgroup_cpus(fs: HostFS, host: Host, vcpus: tuple[Vcpu, ...]) -> tuple[int, ...] | None:
    """The CPUs the cgroups bounding a guest's vCPU threads allow (a KubeVirt
    pod's cpuset, a restricted machine slice), None when that is every
    online CPU or cannot be read."""
    allowed = set(host.cpus)
    for path in {v.cpuset_cgroup for v in vcpus if v.cpuset_cgroup}:
        file = host.cpuset_file(path)
        text = fs.read_or(file) if file else None
        if text and text.strip():
            allowed &= set(parse_cpu_list(text))
    return tuple(sorted(allowed)) if allowed != set(host.cpus) else None


def _with_cgroup_mates(fs: HostFS, host: Host, v: Vcpu) -> Vcpu:
    """``v`` with the other tasks of its own v2 cgroup (a kernel worker
    placed there, say), which a freeze of that cgroup would stop too."""
    if not host.cgroup2_mount or not v.cgroup2 or v.cgroup2 == "/":
        return v
    text = fs.read_or(f"{host.cgroup2_mount}{v.cgroup2}/cgroup.threads") or ""
    others = tuple(int(t) for t in text.split() if t.isdigit() and int(t) != v.tid)
    return replace(v, cgroup_shared=others) if others else v


def build_snapshot(fs: HostFS, facts, presets: Presets, default_preset: str,
                   connected: bool = True, flavors: tuple[tuple[str, str], ...] = (),
                   placed: Placed | None = None) -> Snapshot:
    """A fresh snapshot of the host and the given running domains (``placed``:
    what earlier snapshots learnt of their vCPU threads, kept across calls)."""
    host = read_host(fs)
    domains = tuple(
        build_domain(fs, host, f, presets, default_preset, flavors, placed)
        for f in sorted(facts, key=lambda f: f.name)
    )
    if placed is not None:
        placed.keep({d.pid for d in domains if d.pid})
    host = replace(host, rt_budget_us=rt_budget(fs, host, domains))
    return Snapshot(host=host, domains=domains, taken_at=time.monotonic(), libvirt_connected=connected)


PVE_CLUSTER_DIR = "/etc/pve"
LIBVIRT_SOCKET = "/run/libvirt/libvirt-sock"


def host_sources(fs: HostFS) -> tuple[tuple[str, ...], str]:
    """The sources of guests for a configuration that names none, and why:
    a Proxmox VE host (``/etc/pve``) runs its guests without libvirt, and
    has no libvirtd to be disconnected from."""
    if fs.exists(PVE_CLUSTER_DIR) and not fs.exists(LIBVIRT_SOCKET):
        return ("processes",), f"a Proxmox VE host ({PVE_CLUSTER_DIR}) without a libvirtd ({LIBVIRT_SOCKET})"
    return ("libvirt",), "the default"


class Sources:
    """Several sources as one, for the daemon: the host's libvirtd, QEMU
    processes found in /proc, or both (``sources`` in the configuration).

    A source that cannot answer (libvirtd down: ``domains()`` returns None)
    keeps its last known guests: they run on without libvirtd and stay
    observed, their threads re-read from /proc. ``connected`` is False while
    any source cannot answer; with no libvirt source there is nothing to be
    disconnected from.
    """

    def __init__(self, sources):
        self.sources = list(sources)
        self._last: dict[int, list[DomainFacts]] = {}

    @property
    def connected(self) -> bool:
        return all(s.connected for s in self.sources)

    @property
    def last_error(self) -> str | None:
        return next((s.last_error for s in self.sources if s.last_error), None)

    def ensure_connected(self) -> bool:
        return all([s.ensure_connected() for s in self.sources])

    def domains(self) -> list[DomainFacts]:
        out: list[DomainFacts] = []
        for i, s in enumerate(self.sources):
            got = s.domains()
            if got is not None:
                self._last[i] = got
            out += self._last.get(i, [])
        return out

    def ignored(self) -> dict[str, int]:
        """Processes a source ignored as untrusted, counted by reason."""
        out: dict[str, int] = {}
        for s in self.sources:
            for reason in getattr(s, "ignored", {}).values():
                out[reason] = out.get(reason, 0) + 1
        return out

    def close(self) -> None:
        for s in self.sources:
            s.close()
