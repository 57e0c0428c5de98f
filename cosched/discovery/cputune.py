"""What the platform decided about a libvirt guest's CPUs, from its domain XML.

``<vcpu cpuset="...">`` (every vCPU's default CPUs), ``<cputune>``'s
``<vcpupin vcpu="N" cpuset="...">`` (one vCPU's CPUs; nova writes one per
vCPU for ``hw:cpu_policy=dedicated``) and ``<vcpusched vcpus="..."
scheduler="fifo|rr">`` (realtime vCPUs) and ``<emulatorpin cpuset="...">``
(the emulator threads' CPUs, which cosched never touches). The planner keeps to them
(:mod:`cosched.policy.plan`). cosched pins vCPU threads without libvirt, so
the XML only ever holds the platform's decisions.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET

from cosched.hostfs import parse_cpu_list
from cosched.model import CpuTune


def _cpuset(text: str | None) -> tuple[int, ...] | None:
    """libvirt's cpuset syntax (``0-3,^2,8``) as CPUs; None when absent or unreadable."""
    if not text:
        return None
    keep: set[int] = set()
    drop: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            (drop if part.startswith("^") else keep).update(parse_cpu_list(part.lstrip("^")))
    except ValueError:
        return None
    return tuple(sorted(keep - drop)) or None


def parse_cputune(domain_xml: str, vcpus: int) -> CpuTune:
    """The CPU decisions of a domain (or a ``<domstatus>``'s domain) for its ``vcpus`` vCPUs."""
    try:
        root = ET.fromstring(domain_xml)
    except ET.ParseError:
        return CpuTune()
    if root.tag == "domstatus":
        root = root.find("domain")
        if root is None:
            return CpuTune()
    vcpu = root.find("vcpu")
    default = _cpuset(vcpu.get("cpuset")) if vcpu is not None else None
    pins = {i: default for i in range(vcpus)} if default else {}
    realtime: set[int] = set()
    emulator = None
    tune = root.find("cputune")
    if tune is not None:
        pin = tune.find("emulatorpin")
        emulator = _cpuset(pin.get("cpuset")) if pin is not None else None
        for pin in tune.findall("vcpupin"):
            index, cpus = pin.get("vcpu"), _cpuset(pin.get("cpuset"))
            if index is not None and index.isdigit() and cpus:
                pins[int(index)] = cpus
        for sched in tune.findall("vcpusched"):
            if sched.get("scheduler") in ("fifo", "rr"):
                which = _cpuset(sched.get("vcpus")) or tuple(range(vcpus))
                realtime.update(i for i in which if i < vcpus)
    return CpuTune(pins=tuple(sorted(pins.items())), realtime=tuple(sorted(realtime)), emulator=emulator)
