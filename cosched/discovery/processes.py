"""QEMU processes that no host libvirtd runs, found in /proc.

Proxmox VE starts QEMU itself (``qm start``); KubeVirt runs a private
libvirtd in each VM's pod; anyone can start QEMU by hand. This source finds
them all the same way: a process whose command line runs a system emulator
with a ``-name`` (:mod:`cosched.discovery.qemu`), that is not one of the host
libvirtd's guests (whose pid files are in ``/run/libvirt/qemu``: the libvirt
source reports those), and that the platform started: its executable and
its user must pass :mod:`cosched.trust`. Its vCPU threads are then found as for any guest
(:mod:`cosched.discovery.threads`).

What the guest asks for, first found wins:

* the status file of the libvirtd that runs it, seen through the process's
  own root (``/proc/PID/root/run/libvirt/qemu/NAME.xml``, resolved inside
  that root, at most 1 MiB: :meth:`cosched.hostfs.HostFS.read_in_root`): a KubeVirt pod's
  private libvirtd keeps the domain XML, and its ``cosched:policy``
  annotation, there (its monitor socket is libvirtd's, so its vCPU threads
  are known by name and cgroup, which libvirt always gives them);
* its Proxmox VE configuration, ``PVE_DIR/VMID.conf`` (``-id VMID`` on the
  command line, or the id in its pid file or QMP socket path or in its
  ``qemu.slice/VMID.scope`` cgroup), and the ``cosched-`` tag on its
  ``tags:`` line (grammar in :mod:`cosched.annotation`), re-read at every
  resync;
* otherwise the configured default policy.

Its identity is the UUID on its command line (``-uuid`` or Proxmox's
``-smbios type=1,uuid=``), else ``qemu-VMID`` or ``qemu-pid-PID``. Where its
command line names a QMP server socket, QEMU is asked for its vCPU threads
(:mod:`cosched.discovery.qmp`).
"""
from __future__ import annotations

import logging
import re
from dataclasses import replace

from cosched.annotation import TAG_PREFIX
from cosched.discovery import DomainFacts
from cosched.discovery.qemu import PVE_SCOPE, QemuCmdline, parse
from cosched.discovery.qmp import QmpCache
from cosched.trust import Trust, process_uids, verdict
from cosched.hostfs import HostFS

log = logging.getLogger("cosched.discovery")

PVE_DIR = "/etc/pve/qemu-server"
LIBVIRT_RUN = "/run/libvirt/qemu"
_TAG_SPLIT = re.compile(r"[;,\s]+")


def _section_end(lines: list[str]) -> int:
    """Where a Proxmox VE guest configuration's current section ends
    (snapshots follow in ``[name]`` sections and are not the running guest)."""
    return next((i for i, line in enumerate(lines) if line.startswith("[")), len(lines))


def _field_at(lines: list[str], name: str) -> int | None:
    """The line of ``name:`` in the current section, None when it has none."""
    return next((i for i in range(_section_end(lines))
                 if (part := lines[i].partition(":"))[1] and part[0].strip() == name), None)


def pve_field(text: str, name: str) -> str | None:
    """The value of ``name:`` in a Proxmox VE guest configuration's current
    section, None when it has none."""
    lines = text.splitlines()
    at = _field_at(lines, name)
    return None if at is None else lines[at].partition(":")[2].strip()


def pve_tags(text: str) -> tuple[str, ...]:
    """The ``tags:`` of a Proxmox VE guest configuration's current section."""
    return tuple(t for t in _TAG_SPLIT.split(pve_field(text, "tags") or "") if t)


def with_tag(text: str, tag: str | None) -> str:
    """A Proxmox VE guest configuration with its ``cosched-`` tag replaced
    by ``tag`` (None: removed) and every other tag kept, in its current
    section (snapshots, in ``[name]`` sections, are left as they are)."""
    lines = text.splitlines(keepends=True)
    end, at = _section_end(lines), _field_at(lines, "tags")
    kept = [t for t in pve_tags(text) if not t.lower().startswith(TAG_PREFIX)] + ([tag] if tag else [])
    line = f"tags: {';'.join(kept)}\n" if kept else ""
    if at is not None:
        lines[at] = line
    elif line:
        while end > 0 and not lines[end - 1].strip():      # before the blank line that ends the section
            end -= 1
        if end > 0 and not lines[end - 1].endswith("\n"):
            lines[end - 1] += "\n"
        lines.insert(end, line)
    return "".join(lines)


def guest_config(pve_dir: str, name: str) -> str | None:
    """The configuration file of the Proxmox VE guest named ``name`` (or
    whose VMID it is), None when there is none."""
    import os
    try:
        entries = sorted(os.listdir(pve_dir))
    except OSError:
        return None
    for entry in entries:
        if not entry.endswith(".conf"):
            continue
        path = os.path.join(pve_dir, entry)
        if entry[:-5] == name:
            return path
        try:
            with open(path, encoding="utf-8") as f:
                if pve_field(f.read(), "name") == name:
                    return path
        except OSError:
            continue
    return None


class ProcessSource:
    """Guests that are QEMU processes of their own (see the module doc). Always "connected"."""

    connected = True
    last_error = None

    def __init__(self, fs: HostFS, pve_dir: str = PVE_DIR, qmp: QmpCache | None = None, trust: Trust = Trust()):
        self.fs = fs
        self.pve_dir = pve_dir
        self.qmp = qmp or QmpCache()
        self.trust = trust
        self._seen: set[int] = set()
        self.ignored: dict[int, str] = {}      # pid -> why (a reason of cosched.trust.REASONS)

    def ensure_connected(self) -> bool:
        return True

    def close(self) -> None:
        pass

    def _libvirt_pids(self) -> set[int]:
        pids = set()
        for entry in self.fs.listdir(LIBVIRT_RUN):
            if entry.endswith(".pid"):
                text = (self.fs.read_or(f"{LIBVIRT_RUN}/{entry}") or "").strip()
                if text.isdigit():
                    pids.add(int(text))
        return pids

    def processes(self) -> list[tuple[int, QemuCmdline]]:
        """Every QEMU process in /proc that the host libvirtd does not run and
        that passes the trust checks; the others are in ``ignored``, each said
        once in the log."""
        theirs = self._libvirt_pids()
        found = []
        ignored = {}
        for entry in self.fs.listdir("/proc"):
            if not entry.isdigit() or int(entry) in theirs:
                continue
            pid = int(entry)
            try:
                raw = self.fs.read_bytes(f"/proc/{entry}/cmdline")
                cmd = parse([a.decode(errors="replace") for a in raw.split(b"\0") if a])
                if cmd is None:
                    continue
                path, st = self.fs.exe(pid)
                uids = process_uids(self.fs.read(f"/proc/{entry}/status"))
            except OSError:
                continue                       # gone, or a kernel thread
            why = verdict(path, st, uids, self.trust)
            if why is None:
                found.append((pid, cmd))
                continue
            ignored[pid] = why[0]
            if pid not in self.ignored:
                log.warning("pid=%d name=%s action=process-ignored reason=%s: %s", pid, cmd.name, why[0], why[1])
        self.ignored = ignored
        return found

    def _qmp(self, pid: int, cmd: QemuCmdline) -> tuple[tuple[int, int], ...] | None:
        """QEMU's own vCPU map, through its QMP socket (as seen from its own root)."""
        if not cmd.qmp:
            return None
        path = cmd.qmp if self.fs.exists(cmd.qmp) else f"/proc/{pid}/root{cmd.qmp}"
        threads = frozenset(self.fs.listdir(f"/proc/{pid}/task"))
        answer = self.qmp.get(pid, str(self.fs.path(path)), threads)
        return tuple(sorted(answer.items())) if answer else None

    def _vmid(self, pid: int, cmd: QemuCmdline) -> str | None:
        """Proxmox VE's VM id: from the command line, else from the guest's ``qemu.slice/VMID.scope``."""
        if cmd.vmid:
            return cmd.vmid
        m = PVE_SCOPE.search(self.fs.read_or(f"/proc/{pid}/cgroup") or "")
        return m.group(1) if m else None

    def facts(self, pid: int, cmd: QemuCmdline) -> DomainFacts:
        """One guest's facts: its identity, its vCPU map from QEMU, and what it asks for."""
        cmd = replace(cmd, vmid=self._vmid(pid, cmd))
        uuid = cmd.uuid or (f"qemu-{cmd.vmid}" if cmd.vmid else f"qemu-pid-{pid}")
        qmp = self._qmp(pid, cmd)
        try:
            status = self.fs.read_in_root(f"/proc/{pid}/root", f"{LIBVIRT_RUN}/{cmd.name}.xml")
        except (OSError, ValueError):
            status = None                      # none there (not a KubeVirt pod), or not one to read
        if status is not None:
            return DomainFacts(cmd.name, uuid, xml=status, pid=pid, source="qemu", qmp=qmp)
        conf = self.fs.read_or(f"{self.pve_dir}/{cmd.vmid}.conf") if cmd.vmid and cmd.vmid.isdigit() else None
        if conf is not None:
            return DomainFacts(cmd.name, uuid, pid=pid, source="qemu", tags=pve_tags(conf), qmp=qmp)
        return DomainFacts(cmd.name, uuid, pid=pid, source="qemu", qmp=qmp)

    def domains(self) -> list[DomainFacts]:
        out = []
        for pid, cmd in self.processes():
            out.append(self.facts(pid, cmd))
            if pid not in self._seen:
                log.info("domain=%s pid=%d action=found-process vmid=%s qmp=%s vcpus_from_qmp=%s", cmd.name, pid,
                         cmd.vmid or "-", cmd.qmp or "-", len(out[-1].qmp or ()))
        self._seen = {f.pid for f in out}
        self.qmp.forget(self._seen)
        return out
