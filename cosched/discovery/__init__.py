"""Discovery: the only code that reads libvirt, /proc and /sys to build the model.

``host`` reads the CPU topology and cgroup layout, ``threads`` maps a QEMU
process's threads to vCPU indexes, ``libvirt`` keeps a connection with events
and reconnects, and :func:`build_snapshot` ties them into a
:class:`~cosched.model.Snapshot`.
"""
from __future__ import annotations

import time

from cosched.annotation import AnnotationError, domain_policy
from cosched.discovery.host import read_host
from cosched.discovery.threads import find_qemu_pid, vcpu_threads
from cosched.hostfs import HostFS
from cosched.model import Domain, Host, Snapshot
from cosched.policy.params import ParamError
from cosched.policy.presets import Presets


def build_domain(fs: HostFS, host: Host, name: str, uuid: str, xml: str,
                 presets: Presets, default_preset: str) -> Domain:
    """One domain of the model from libvirt's facts and /proc."""
    error = None
    policy = None
    try:
        policy = domain_policy(xml, presets, default_preset)
    except (AnnotationError, ParamError) as e:
        error = str(e)
    pid = find_qemu_pid(fs, name, uuid)
    vcpus, warnings = vcpu_threads(fs, pid, host.cgroup2_mount) if pid else ((), ())
    return Domain(name=name, uuid=uuid, pid=pid, vcpus=vcpus, policy=policy, error=error, warnings=warnings)


def build_snapshot(fs: HostFS, facts, presets: Presets, default_preset: str,
                   connected: bool = True) -> Snapshot:
    """A fresh snapshot of the host and the given running domains."""
    host = read_host(fs)
    domains = tuple(
        build_domain(fs, host, f.name, f.uuid, f.xml, presets, default_preset)
        for f in sorted(facts, key=lambda f: f.name)
    )
    return Snapshot(host=host, domains=domains, taken_at=time.monotonic(), libvirt_connected=connected)
