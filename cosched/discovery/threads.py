"""Which thread of a QEMU process runs which vCPU.

Up to three independent witnesses, cross-checked:

* the thread name QEMU gives each vCPU thread: ``CPU <n>/KVM`` (or ``/TCG``,
  ``/HVF``, ``/WHPX``) in ``/proc/PID/task/TID/comm`` (with ``-name
  ...,debug-threads=on``, which libvirt and Proxmox VE always pass);
* the cgroup libvirt (or, for a guest without one, cosched) moves each vCPU
  thread into: ``.../vcpu<n>`` in ``/proc/PID/task/TID/cgroup`` (the v2
  line, or a v1 controller line);
* where discovery asked QEMU over QMP (:mod:`cosched.discovery.qmp`), its own
  ``cpu-index`` -> ``thread-id`` map.

The cgroup wins, then QEMU's word, then the name; a disagreement is a
warning naming the thread. Threads come and go (hot-plug, shutdown); a
thread that vanishes between two reads is simply left out.
"""
from __future__ import annotations

import re
from dataclasses import replace

from cosched.hostfs import HostFS, parse_cpu_list
from cosched.kernel import ProcStat, events_frozen, parse_stat, status_field
from cosched.model import Vcpu

_COMM = re.compile(r"^CPU (\d+)/(KVM|TCG|HVF|WHPX|NVMM)$")
_VCPU_CG = re.compile(r"/vcpu(\d+)$")


def find_qemu_pid(fs: HostFS, name: str, uuid: str) -> int | None:
    """The QEMU process of a domain: libvirt's pid file, checked by the UUID on
    its command line; else a scan of /proc for ``-uuid <uuid>``."""
    for pidfile in (f"/run/libvirt/qemu/{name}.pid",):
        text = (fs.read_or(pidfile) or "").strip()
        if text.isdigit() and _has_uuid(fs, int(text), uuid):
            return int(text)
    for entry in fs.listdir("/proc"):
        if entry.isdigit() and _has_uuid(fs, int(entry), uuid):
            return int(entry)
    return None


def _has_uuid(fs: HostFS, pid: int, uuid: str) -> bool:
    try:
        args = fs.read_bytes(f"/proc/{pid}/cmdline").split(b"\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    target = uuid.encode()
    return any(a == b"-uuid" and i + 1 < len(args) and args[i + 1] == target for i, a in enumerate(args))


def _cgroups(text: str) -> tuple[int | None, str | None, str | None, str | None]:
    """(vCPU index, v2 path, v1 cpu path, bounding cpuset path) from libvirt's
    ``vcpuN`` cgroups of one thread.

    The v2 and cpu paths are given only once libvirt has moved the thread
    into its own ``vcpuN`` cgroup: right after QEMU starts, vCPU threads
    still sit in the emulator's cgroup, and freezing that would stop the
    whole guest. The bounding cpuset is the guest's cgroup in the cpuset
    hierarchy (v1 ``cpuset``, else v2): the parent of a ``vcpuN`` cgroup
    (whose own cpuset libvirt rewrites when it pins the vCPU), or the
    thread's cgroup itself.
    """
    index = None
    v2 = cpu = None
    cpuset = v2_any = None
    for line in text.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        m = _VCPU_CG.search(path)
        bound = (path[:m.start()] or "/") if m else path
        if hier == "0" and controllers == "":
            v2_any = bound
        elif "cpuset" in controllers.split(","):
            cpuset = bound
        if not m:
            continue
        if hier == "0" and controllers == "":
            v2 = path
        if "cpu" in controllers.split(","):
            cpu = path
        if index is None or hier == "0":
            index = int(m.group(1))
    return index, v2, cpu, cpuset or v2_any


def thread_stat(fs: HostFS, tid: int, pid: int | None = None) -> ProcStat | None:
    """The thread's ``stat`` fields, None if it is gone."""
    return parse_stat(fs.read_or(f"/proc/{pid}/task/{tid}/stat" if pid else f"/proc/{tid}/stat") or "")


def affinity(fs: HostFS, pid: int, tid: int) -> tuple[int, ...]:
    """The thread's CPU affinity now (empty if it is gone)."""
    cpus = status_field(fs.read_or(f"/proc/{pid}/task/{tid}/status"), "Cpus_allowed_list")
    return parse_cpu_list(cpus) if cpus is not None else ()


def frozen(fs: HostFS, cgroup2_mount: str | None, path: str | None) -> bool | None:
    """Whether the v2 cgroup ``path`` is frozen now (None without such a cgroup)."""
    if not cgroup2_mount or not path or path == "/":
        return None
    return events_frozen(fs.read_or(f"{cgroup2_mount}{path}/cgroup.events"))


class Placed:
    """vCPU threads already in their own ``vcpuN`` cgroups, by (pid, tid) and
    start time: what a resync need not read again (a placed thread stays
    placed). With it a resync reads one ``stat`` per known vCPU thread instead
    of five files; at a thousand vCPUs that is most of its cost. A known
    thread keeps the affinity it had when first seen placed: the platform's,
    before cosched pinned it."""

    def __init__(self):
        self.known: dict[tuple[int, int], tuple[int, Vcpu]] = {}

    def keep(self, pids: set[int]) -> None:
        self.known = {k: v for k, v in self.known.items() if k[0] in pids}


def vcpu_threads(fs: HostFS, pid: int, cgroup2_mount: str | None, qmp: dict[int, int] | None = None,
                 placed: Placed | None = None) -> tuple[tuple[Vcpu, ...], tuple[str, ...]]:
    """The vCPU threads of QEMU process ``pid`` sorted by index, and warnings;
    ``qmp``: QEMU's own ``{index: thread id}``, when it was asked; ``placed``:
    what earlier calls learnt. ``cpus`` and ``realtime`` are a vCPU's
    affinity and whether it ran under SCHED_FIFO or SCHED_RR when first
    seen (the platform's: cosched changes only threads it has seen); its
    frozen and scheduling state now are read live by status."""
    found: dict[int, Vcpu] = {}
    warnings: list[str] = []
    said = {tid: index for index, tid in (qmp or {}).items()}
    for entry in fs.listdir(f"/proc/{pid}/task"):
        if not entry.isdigit():
            continue
        tid = int(entry)
        stat = thread_stat(fs, tid, pid)
        if stat is None:
            continue                                  # exited while we looked
        known = placed.known.get((pid, tid)) if placed is not None else None
        if known is not None and known[0] == stat.start_time:
            if known[1].index not in found:
                found[known[1].index] = replace(known[1], sched=stat.policy, priority=stat.rt_priority)
            continue
        comm = (fs.read_or(f"/proc/{pid}/task/{tid}/comm") or "").strip()
        m = _COMM.match(comm)
        name_index = int(m.group(1)) if m else None
        cg_index, v2, cpu_cg, cpuset = _cgroups(fs.read_or(f"/proc/{pid}/task/{tid}/cgroup") or "")
        qmp_index = said.get(tid)
        if name_index is not None and cg_index is not None and name_index != cg_index:
            warnings.append(f"tid={tid} is named {comm!r} but sits in cgroup vcpu{cg_index}; using vcpu{cg_index}")
        if qmp_index is not None and qmp_index != (cg_index if cg_index is not None else name_index) and (
                cg_index is not None or name_index is not None):
            warnings.append(f"tid={tid}: QEMU says vCPU {qmp_index}, its "
                            + (f"cgroup vcpu{cg_index}" if cg_index is not None else f"name {comm!r}")
                            + f"; using {cg_index if cg_index is not None else qmp_index}")
        index = cg_index if cg_index is not None else qmp_index if qmp_index is not None else name_index
        if index is None:
            continue
        if index in found:
            warnings.append(f"vcpu{index}: two threads ({found[index].tid}, {tid}); keeping {found[index].tid}")
            continue
        found[index] = Vcpu(index=index, tid=tid, cgroup2=v2, cpu_cgroup=cpu_cg, start_time=stat.start_time,
                            cpus=affinity(fs, pid, tid), sched=stat.policy, priority=stat.rt_priority,
                            cpuset_cgroup=cpuset, realtime=stat.policy in ("fifo", "rr"))
        if placed is not None and cg_index is not None:
            placed.known[(pid, tid)] = (stat.start_time, found[index])
    return tuple(found[i] for i in sorted(found)), tuple(warnings)


def live_state(fs: HostFS, cgroup2_mount: str | None, vcpu: Vcpu, pid: int | None) -> dict:
    """A vCPU's affinity, frozen and scheduling state read now (``cpus``,
    ``frozen``, ``sched``, ``priority``), falling back to the snapshot's for
    what cannot be read."""
    now = frozen(fs, cgroup2_mount, vcpu.cgroup2)
    stat = thread_stat(fs, vcpu.tid, pid)
    return {"cpus": list(affinity(fs, pid, vcpu.tid)) if pid else list(vcpu.cpus),
            "frozen": vcpu.frozen if now is None else now,
            "sched": stat.policy if stat else vcpu.sched,
            "priority": stat.rt_priority if stat else vcpu.priority}
