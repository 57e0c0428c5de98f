"""Host CPU topology from /sys and the cgroup layout from /proc/self/mountinfo."""
from __future__ import annotations

import re

from cosched.actuators.rt_runtime import read_runtime
from cosched.hostfs import HostFS, find_mount, mounts, parse_cpu_list
from cosched.model import Domain, Host

_NODE = re.compile(r"node(\d+)$")


def cgroup_layout(fs: HostFS) -> tuple[str, str | None]:
    """(``unified`` | ``hybrid`` | ``legacy``, v2 mount point or None).

    ``unified``: only cgroup2 is mounted (pure v2 hosts). ``hybrid``: v1
    controllers plus a v2 tree (often /sys/fs/cgroup/unified). ``legacy``:
    no v2 tree at all.
    """
    return _layout(mounts(fs))


def _layout(found) -> tuple[str, str | None]:
    v2 = find_mount(found, "cgroup2")
    if v2 is None:
        return "legacy", None
    return ("hybrid" if find_mount(found, "cgroup") else "unified"), v2


def read_host(fs: HostFS) -> Host:
    online = parse_cpu_list(fs.read_or("/sys/devices/system/cpu/online") or "0")
    core_of: dict[int, tuple[int, int]] = {}
    for cpu in online:
        topo = f"/sys/devices/system/cpu/cpu{cpu}/topology"
        package = int((fs.read_or(f"{topo}/physical_package_id") or "0").strip() or 0)
        core = int((fs.read_or(f"{topo}/core_id") or str(cpu)).strip() or cpu)
        core_of[cpu] = (package, core)
    node_of: dict[int, int] = {}
    for entry in fs.listdir("/sys/devices/system/node"):
        m = _NODE.match(entry)
        if m:
            for cpu in parse_cpu_list(fs.read_or(f"/sys/devices/system/node/{entry}/cpulist") or ""):
                node_of[cpu] = int(m.group(1))
    for cpu in online:
        node_of.setdefault(cpu, 0)
    found = mounts(fs)                      # mountinfo read once per snapshot
    mode, mount = _layout(found)
    cpu_mount = find_mount(found, "cgroup", "cpu")
    rt_group = cpu_mount is not None and fs.exists(f"{cpu_mount}/cpu.rt_runtime_us")
    return Host(cpus=online, core_of=core_of, node_of=node_of, cgroup=mode, cgroup2_mount=mount,
                cpu_v1_mount=cpu_mount, rt_group_sched=rt_group, cpuset_v1_mount=find_mount(found, "cgroup", "cpuset"))


def rt_budget(fs: HostFS, host: Host, domains: tuple[Domain, ...]) -> int | None:
    """RT runtime the vCPU groups may share on a kernel with RT group
    scheduling: the root's, less what top groups other than the guests' hold
    (None without RT group scheduling, or where the root is unreadable)."""
    if not host.rt_group_sched:
        return None
    try:
        root = read_runtime(fs, f"{host.cpu_v1_mount}/cpu.rt_runtime_us")
    except (OSError, ValueError):
        return None
    root = 950_000 if root < 0 else root
    ours = {host.rt_chain(v)[0] for d in domains for v in d.vcpus if host.rt_chain(v)}
    others = 0
    for entry in fs.listdir(host.cpu_v1_mount):
        path = f"{host.cpu_v1_mount}/{entry}/cpu.rt_runtime_us"
        if path not in ours and fs.exists(path):
            try:
                others += max(read_runtime(fs, path), 0)
            except (OSError, ValueError):
                pass
    return max(root - others, 0)
