"""The model: plain frozen dataclasses describing what discovery saw.

No I/O here. A :class:`Snapshot` is built by discovery, read by policy,
the sampler, metrics and the status socket, and replaced whole on every
resync (never mutated), so readers in other threads need no lock.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class Host:
    """Host CPU topology and cgroup layout."""

    cpus: tuple[int, ...]                      # online CPUs
    core_of: Mapping[int, tuple[int, int]]     # cpu -> (package, core)
    node_of: Mapping[int, int]                 # cpu -> NUMA node
    cgroup: str                                # "unified", "hybrid" or "legacy"
    cgroup2_mount: str | None                  # where the v2 tree is mounted
    cpu_v1_mount: str | None = None            # v1 cpu controller, if mounted
    rt_group_sched: bool = False               # SCHED_FIFO needs cpu.rt_runtime_us grants
    cpuset_v1_mount: str | None = None         # v1 cpuset controller, if mounted
    rt_budget_us: int | None = None            # RT runtime the vCPU groups may share (RT group scheduling), else None

    def siblings(self, cpu: int) -> tuple[int, ...]:
        """SMT siblings of ``cpu`` (itself included)."""
        core = self.core_of.get(cpu)
        return tuple(c for c in self.cpus if self.core_of.get(c) == core)

    @property
    def cores(self) -> tuple[tuple[int, ...], ...]:
        """Online CPUs grouped by physical core."""
        seen: dict[tuple[int, int], list[int]] = {}
        for cpu in self.cpus:
            seen.setdefault(self.core_of.get(cpu, (0, cpu)), []).append(cpu)
        return tuple(tuple(v) for v in seen.values())

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.node_of.values()))) or (0,)

    def _cgroup2_file(self, vcpu: "Vcpu", name: str) -> str | None:
        if not self.cgroup2_mount or not vcpu.cgroup2 or vcpu.cgroup2 == "/":
            return None
        return f"{self.cgroup2_mount}{vcpu.cgroup2}/{name}"

    def freeze_file(self, vcpu: "Vcpu") -> str | None:
        """Host path of the vCPU's v2 ``cgroup.freeze``, if it has its own cgroup."""
        return self._cgroup2_file(vcpu, "cgroup.freeze")

    def frozen_time_file(self, vcpu: "Vcpu") -> str | None:
        """Host path of the vCPU's v2 ``cgroup.stat.local``, if it has its own
        cgroup: ``frozen_usec``, the time its cgroup has been frozen
        (Linux 6.17 on; the file is missing before)."""
        return self._cgroup2_file(vcpu, "cgroup.stat.local")

    def cpuset_file(self, path: str) -> str | None:
        """Host path of the CPUs cgroup ``path`` allows its tasks (the cpuset
        hierarchy's ``effective`` list: v1 where the cpuset controller is
        mounted there, else v2, where the file exists only while the cpuset
        controller is enabled for the cgroup)."""
        if self.cpuset_v1_mount:
            return f"{self.cpuset_v1_mount}{path.rstrip('/')}/cpuset.effective_cpus"
        if self.cgroup2_mount:
            return f"{self.cgroup2_mount}{path.rstrip('/')}/cpuset.cpus.effective"
        return None

    def rt_chain(self, vcpu: "Vcpu") -> tuple[str, ...]:
        """``cpu.rt_runtime_us`` files a SCHED_FIFO boost of the vCPU needs, top-down
        (empty without RT group scheduling)."""
        if not self.rt_group_sched or not vcpu.cpu_cgroup:
            return ()
        parts = [p for p in vcpu.cpu_cgroup.split("/") if p]
        return tuple(f"{self.cpu_v1_mount}/{'/'.join(parts[:i])}/cpu.rt_runtime_us" for i in range(1, len(parts) + 1))


@dataclass(frozen=True)
class PolicySpec:
    """What a guest asked for: a preset, its policy kind and final parameters."""

    preset: str
    kind: str
    params: tuple[tuple[str, object], ...] = ()
    source: str = "default"                    # "annotation", "extra-spec", "flavor" or "default"


@dataclass(frozen=True)
class Vcpu:
    index: int
    tid: int
    cgroup2: str | None = None                 # v2 cgroup path of the thread
    cpu_cgroup: str | None = None              # v1 cpu controller path (RT group scheduling)
    start_time: int = 0                        # /proc stat starttime: tells a reused TID apart
    cpus: tuple[int, ...] = ()                 # affinity when discovery first saw the thread (the platform's)
    sched: str = "other"                       # "other", "fifo", "rr", ...
    priority: int = 0                          # rt priority
    frozen: bool = False                       # v2 cgroup.events says frozen
    cgroup_shared: tuple[int, ...] = ()        # other tasks in its v2 cgroup: freezing it would stop them too
    cpuset_cgroup: str | None = None           # the guest's cgroup whose cpuset bounds the thread (v1 cpuset, else v2)
    realtime: bool = False                     # under fifo or rr when discovery first saw it: the platform's choice


@dataclass(frozen=True)
class CpuTune:
    """What the platform decided about a guest's CPUs: each pinned vCPU's
    CPUs (``<vcpupin>``, ``<vcpu cpuset>``), its realtime vCPUs
    (``<vcpusched>`` fifo or rr), its emulator threads' CPUs
    (``<emulatorpin>``) and the CPUs its cgroup's cpuset allows (None: no
    narrower than the host's)."""

    pins: tuple[tuple[int, tuple[int, ...]], ...] = ()
    realtime: tuple[int, ...] = ()
    emulator: tuple[int, ...] | None = None
    cgroup_cpus: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Domain:
    name: str
    uuid: str
    pid: int | None
    vcpus: tuple[Vcpu, ...]
    policy: PolicySpec | None                  # None when the annotation is invalid
    error: str | None = None                   # why the domain is not managed
    warnings: tuple[str, ...] = ()
    source: str = "libvirt"                    # "libvirt": the host's libvirtd runs it; "qemu": found in /proc
    cputune: CpuTune = CpuTune()               # the platform's CPU decisions (libvirt's domain XML)


@dataclass(frozen=True)
class Snapshot:
    host: Host
    domains: tuple[Domain, ...] = ()
    taken_at: float = 0.0                      # time.monotonic()
    libvirt_connected: bool = True

    def domain(self, name: str) -> Domain | None:
        return next((d for d in self.domains if d.name == name), None)
