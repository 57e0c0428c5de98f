"""What a QEMU command line says about its guest: name, identity, pid file, QMP socket.

QEMU processes that no host libvirtd runs (Proxmox VE's ``qm``, a KubeVirt
pod's private libvirtd, a hand-started guest) are recognised by their
executable (``qemu-system-*``, or Proxmox's ``kvm``) and described by their
options:

``-name NAME[,debug-threads=on]`` or ``-name guest=NAME,...``
    the guest's name (``debug-threads=on`` is what names vCPU threads
    ``CPU n/KVM``: without it the threads are all called ``qemu-system-x86``
    and the QMP map below is the only witness);
``-uuid UUID``, or ``-smbios type=1,uuid=UUID`` (Proxmox VE)
    its identity; without either, ``-id`` (Proxmox's VMID) or the pid stands in;
``-id VMID``
    Proxmox VE's VM id, which names its configuration file (an option of
    Proxmox's own QEMU build; with another QEMU, the id in a
    ``.../qemu-server/VMID.pid`` or ``VMID.qmp`` path stands in, and the
    processes source also reads it from the ``qemu.slice/VMID.scope`` cgroup);
``-pidfile PATH``;
``-qmp unix:PATH[,...]``, or ``-chardev socket,id=ID,path=PATH,server=on,...``
with ``-mon chardev=ID,mode=control`` (a client socket, such as Proxmox's
``qmeventd`` one, is not the guest's QMP server)
    a QMP socket (``query-cpus-fast`` maps vCPU indexes to threads).

Values may be quoted as a shell would leave them (Proxmox passes
``-name 'vm100,debug-threads=on'`` through a shell-free exec, so no quotes
reach /proc, but a hand-written script may).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class QemuCmdline:
    name: str
    uuid: str | None = None
    vmid: str | None = None
    pidfile: str | None = None
    qmp: str | None = None
    debug_threads: bool = False


def is_qemu(argv: list[str]) -> bool:
    """Whether ``argv`` runs a system emulator (``qemu-system-*`` or Proxmox's ``kvm``)."""
    if not argv:
        return False
    exe = os.path.basename(argv[0])
    return exe.startswith("qemu-system-") or exe in ("kvm", "qemu-kvm")


def _options(value: str) -> tuple[str, dict[str, str]]:
    """``first,key=value,...`` -> (first item when it has no ``=``, the rest as a dict)."""
    head, opts = "", {}
    for i, part in enumerate(value.strip("'\"").split(",")):
        key, sep, val = part.partition("=")
        if not sep and i == 0:
            head = key
        elif sep:
            opts[key] = val
        else:
            opts[key] = "on"
    return head, opts


def parse(argv: list[str]) -> QemuCmdline | None:
    """The guest a QEMU command line runs; None when it is not one (no ``-name``)."""
    if not is_qemu(argv):
        return None
    args = {}
    chardevs: dict[str, str] = {}
    monitors: list[str] = []
    qmp = None
    for i, arg in enumerate(argv[:-1]):
        if not arg.startswith("-"):
            continue
        option, value = arg.lstrip("-"), argv[i + 1]
        if option == "chardev":
            kind, opts = _options(value)
            if kind == "socket" and "id" in opts and "path" in opts and opts.get("server") in ("on", "yes"):
                chardevs[opts["id"]] = opts["path"]
        elif option == "mon":
            _, opts = _options(value)
            if opts.get("mode") == "control" and "chardev" in opts:
                monitors.append(opts["chardev"])
        elif option == "qmp" and qmp is None:
            head, _ = _options(value)
            if head.startswith("unix:"):
                qmp = head[len("unix:"):]
        else:
            args.setdefault(option, value)
    if "name" not in args:
        return None
    head, opts = _options(args["name"])
    name = opts.get("guest") or head
    if not name:
        return None
    uuid = args.get("uuid")
    if uuid is None and "smbios" in args:
        kind, smbios = _options(args["smbios"])
        uuid = smbios.get("uuid")
    qmp = qmp or next((chardevs[m] for m in monitors if m in chardevs), None)
    vmid = args.get("id") or next((m.group(1) for p in (args.get("pidfile"), qmp) if p
                                   for m in [_PVE_PATH.search(p)] if m), None)
    return QemuCmdline(name=name, uuid=uuid, vmid=vmid, pidfile=args.get("pidfile"), qmp=qmp,
                       debug_threads=opts.get("debug-threads") == "on")


_PVE_PATH = re.compile(r"/qemu-server/(\d+)\.(?:pid|qmp)$")
PVE_SCOPE = re.compile(r"/qemu\.slice/(\d+)\.scope(?:/|$)")
