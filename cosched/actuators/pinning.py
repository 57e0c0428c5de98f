"""vCPU pinning through libvirt's own API (``virDomainPinVcpuFlags``, live).

libvirt owns the vCPU cpuset cgroups and records pinning in the live domain
XML, so cosched pins through libvirt rather than writing cpuset files under
it. Each managed vCPU gets one host CPU, siblings on distinct CPUs (balance
scheduling); the original cpumap is journaled first and restored afterwards.
"""
from __future__ import annotations

import libvirt


def cpumap_for(cpus, host_cpus: int) -> tuple[bool, ...]:
    return tuple(i in set(cpus) for i in range(host_cpus))


class LibvirtPinner:
    def __init__(self, conn_getter):
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
    """A stopped domain is a LookupError (nothing to do); anything else an OSError."""
    if e.get_error_code() in (libvirt.VIR_ERR_NO_DOMAIN, libvirt.VIR_ERR_OPERATION_INVALID):
        return LookupError(uuid)
    return OSError(0, f"domain {uuid}: {e.get_error_message()}")
