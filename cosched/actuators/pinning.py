"""vCPU pinning through libvirt's own API (``virDomainPinVcpuFlags``, live).

libvirt owns the vCPU cpuset cgroups and records pinning in the live domain
XML, so cosched pins through libvirt rather than writing cpuset files under
it. Each managed vCPU gets one host CPU, siblings on distinct CPUs (balance
scheduling). The journal entry (kind ``pin``) holds one vCPU's live cpumap
before cosched's first pin; restoring pins it back. Where the platform
narrowed the guest's cgroup cpuset under libvirt (libvirt's map still says
more CPUs than the thread could use), the entry also holds the CPUs the
thread really had (``within``), and restoring pins those when libvirt
cannot write its own map back.
"""
from __future__ import annotations

from typing import Callable

import libvirt

from cosched.actuators.journal import Gone
from cosched.virt import domain_gone

KIND = "pin"


def cpumap_for(cpus, host_cpus: int) -> tuple[bool, ...]:
    return tuple(i in set(cpus) for i in range(host_cpus))


class LibvirtPinner:
    """Live vCPU pinning of one libvirt connection (``conn_getter`` returns it, or None)."""

    def __init__(self, conn_getter: Callable[[], "libvirt.virConnect | None"]):
        self._conn = conn_getter

    def _dom(self, uuid: str) -> libvirt.virDomain:
        conn = self._conn()
        if conn is None:
            raise ConnectionError("libvirt is not connected")
        try:
            return conn.lookupByUUIDString(uuid)
        except libvirt.libvirtError as e:
            raise _error(uuid, e) from None

    def current(self, uuid: str) -> list[tuple[bool, ...]]:
        """Live cpumap of every vCPU of the domain."""
        try:
            return [tuple(m) for m in self._dom(uuid).vcpuPinInfo(libvirt.VIR_DOMAIN_AFFECT_LIVE)]
        except libvirt.libvirtError as e:
            raise _error(uuid, e) from None

    def pin(self, uuid: str, vcpu: int, cpumap) -> None:
        try:
            self._dom(uuid).pinVcpuFlags(vcpu, tuple(cpumap), libvirt.VIR_DOMAIN_AFFECT_LIVE)
        except libvirt.libvirtError as e:
            raise _error(uuid, e) from None


def _error(uuid: str, e: libvirt.libvirtError) -> Exception:
    """A stopped domain is :class:`Gone` (nothing to do); anything else an OSError."""
    if domain_gone(e):
        return Gone(f"domain {uuid} is not running")
    return OSError(0, f"domain {uuid}: {e.get_error_message()}")


class PinKnob:
    """Record, restore and verify live vCPU pinning, through a pinner
    (:class:`LibvirtPinner` or a test's fake); ``pinner`` None means libvirt is unreachable."""

    kind = KIND

    def __init__(self, pinner):
        self.pinner = pinner

    @staticmethod
    def key(uuid: str, vcpu: int) -> str:
        """The journal key of one vCPU's original pinning."""
        return f"{KIND}:{uuid}:{vcpu}"

    def record(self, uuid: str, name: str, within: dict[int, tuple[int, ...]] | None = None) -> dict[str, dict]:
        """Journal entries of every vCPU's live cpumap (read now); ``within``:
        the CPUs each vCPU's thread may use, as discovery first saw them."""
        out = {}
        for index, cpumap in enumerate(self._pinner().current(uuid)):
            entry = {"kind": KIND, "uuid": uuid, "name": name, "vcpu": index, "cpumap": list(cpumap)}
            real = (within or {}).get(index)
            if real and {i for i, on in enumerate(cpumap) if on} - set(real):
                entry["within"] = list(cpumap_for(real, len(cpumap)))
            out[self.key(uuid, index)] = entry
        return out

    def _pinner(self):
        if self.pinner is None:
            raise ConnectionError("libvirt is unreachable")
        return self.pinner

    def restore(self, entry: dict) -> None:
        try:
            self._pinner().pin(entry["uuid"], entry["vcpu"], entry["cpumap"])
        except OSError:
            if "within" not in entry:
                raise
            self._pinner().pin(entry["uuid"], entry["vcpu"], entry["within"])

    def verify(self, entry: dict) -> bool:
        try:
            current = self._pinner().current(entry["uuid"])
        except Gone:
            return True
        return entry["vcpu"] >= len(current) or list(current[entry["vcpu"]]) in (
            list(entry["cpumap"]), list(entry.get("within", entry["cpumap"])))
