"""libvirt facts shared by discovery and the pinning actuator."""
from __future__ import annotations

import libvirt

# A domain that stopped or vanished while we talked to it: normal life, not an error.
DOMAIN_GONE = (libvirt.VIR_ERR_NO_DOMAIN, libvirt.VIR_ERR_OPERATION_INVALID)


def domain_gone(e: libvirt.libvirtError) -> bool:
    return e.get_error_code() in DOMAIN_GONE
