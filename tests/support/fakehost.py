"""A fake host tree (/proc, /sys, cgroupfs, /run) under a temporary root."""
from __future__ import annotations

import os
from pathlib import Path

from cosched.actuators.affinity import AffinityKnob
from cosched.hostfs import HostFS
from cosched.trust import Trust

HYBRID_MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
UNIFIED_MOUNTINFO = "30 23 0:27 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw\n"


class CgroupEventsFS(HostFS):
    """A host tree whose ``cgroup.events`` follows ``cgroup.freeze`` as the
    kernel's does, except in ``stuck`` cgroups, which never report frozen.
    Every write is recorded in ``writes``, and files the switcher keeps open
    are read and written through ``read``/``write``, so a subclass that
    changes those sees every access."""

    def __init__(self, root, stuck=()):
        super().__init__(root)
        self.stuck = set(stuck)
        self.writes: list[tuple[str, str]] = []

    def write(self, host_path, data):
        self.writes.append((host_path, data))
        super().write(host_path, data)
        if host_path.endswith("/cgroup.freeze"):
            cg = host_path.rsplit("/", 1)[0]
            frozen = data == "1" and cg not in self.stuck
            super().write(cg + "/cgroup.events", f"populated 1\nfrozen {int(frozen)}\n")

    def open_file(self, host_path, write=False):
        return PathFile(self, host_path)


class PathFile:
    """An ``OpenFile`` that goes through its HostFS by path on every access."""

    def __init__(self, fs: HostFS, host_path: str):
        self.fs, self.host_path = fs, host_path

    def read(self, size: int = 4096) -> str:
        return self.fs.read(self.host_path)[:size]

    def write(self, data: str) -> None:
        self.fs.write(self.host_path, data)

    def close(self) -> None:
        pass


class FakeHost:
    def __init__(self, root: Path, cpus: int = 2, smt: int = 1, nodes: int = 1, mode: str = "hybrid"):
        self.root = root
        self.cg2 = "/sys/fs/cgroup/unified" if mode == "hybrid" else "/sys/fs/cgroup"
        self.write("/proc/self/mountinfo", HYBRID_MOUNTINFO if mode == "hybrid" else UNIFIED_MOUNTINFO)
        self.write("/sys/devices/system/cpu/online", f"0-{cpus - 1}\n")
        per_node = cpus // nodes
        for cpu in range(cpus):
            topo = f"/sys/devices/system/cpu/cpu{cpu}/topology"
            self.write(f"{topo}/physical_package_id", f"{cpu // per_node}\n")
            self.write(f"{topo}/core_id", f"{cpu // smt}\n")
        for node in range(nodes):
            self.write(f"/sys/devices/system/node/node{node}/cpulist",
                       f"{node * per_node}-{(node + 1) * per_node - 1}\n")

    def write(self, host_path: str, text: str | bytes) -> Path:
        p = self.root / host_path.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(text if isinstance(text, bytes) else text.encode())
        return p

    # the trust the processes source needs for this tree: its files are the test runner's
    trust = Trust(owner=os.getuid(), users=frozenset({0, os.getuid()}))

    def process(self, pid: int, argv: list[str], exe: str | None = None, uid: int | None = None) -> None:
        """Process ``pid``: its command line, its executable (``exe``, else
        ``argv[0]`` made absolute under /usr/bin: a file of this tree, linked
        from ``/proc/PID/exe`` as the kernel does) and its user (default: the
        test runner's, whom ``trust`` takes)."""
        self.write(f"/proc/{pid}/cmdline", b"\0".join(a.encode() for a in argv) + b"\0")
        exe = exe or (argv[0] if argv[0].startswith("/") else f"/usr/bin/{argv[0]}")
        target = self.root / exe.lstrip("/")
        if not target.exists():
            self.write(exe, b"\x7fELF")
            target.chmod(0o755)
        link = self.root / f"proc/{pid}/exe"
        link.unlink(missing_ok=True)
        link.symlink_to(target)
        uid = os.getuid() if uid is None else uid
        self.write(f"/proc/{pid}/status", f"Name:\tqemu\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")

    def qemu(self, pid: int, name: str, uuid: str, vcpus: dict[int, int], accel: str = "TCG",
             pidfile: bool = True, cgroups: bool = True, scope: str | None = None) -> None:
        """A QEMU process ``pid`` whose vCPU ``index`` runs in thread ``vcpus[index]``."""
        scope = scope or f"/machine/qemu-1-{name}.libvirt-qemu"
        self.process(pid, ["/usr/bin/qemu-system-x86_64", "-name", f"guest={name}", "-uuid", uuid])
        if pidfile:
            self.write(f"/run/libvirt/qemu/{name}.pid", str(pid))
        self.thread(pid, pid, "qemu-system-x86", f"{scope}/emulator" if cgroups else "/")
        for index, tid in vcpus.items():
            self.thread(pid, tid, f"CPU {index}/{accel}", f"{scope}/vcpu{index}" if cgroups else "/")

    def thread(self, pid: int, tid: int, comm: str, cgroup: str, policy: int = 0, prio: int = 0,
               cpus: str = "0-1", run_ns: int = 0, wait_ns: int = 0) -> None:
        base = f"/proc/{pid}/task/{tid}"
        self.write(f"{base}/comm", comm + "\n")
        self.write(f"{base}/cgroup", f"2:cpuset:{cgroup}\n1:cpu:{cgroup}\n0::{cgroup}\n")
        self.write(f"/proc/{tid}/cgroup", f"2:cpuset:{cgroup}\n1:cpu:{cgroup}\n0::{cgroup}\n")
        self.stat(pid, tid, comm, policy=policy, prio=prio)
        self.write(f"{base}/status", f"Name:\t{comm}\nCpus_allowed_list:\t{cpus}\n")
        self.schedstat(pid, tid, run_ns, wait_ns)
        self.write(f"{self.cg2}{cgroup}/cgroup.events", "populated 1\nfrozen 0\n")

    def stat(self, pid: int, tid: int, comm: str, state: str = "S", cpu: int = 0, policy: int = 0, prio: int = 0) -> None:
        """``/proc/.../stat`` of a thread: state (field 3), start time (22), CPU (39), priority and policy."""
        rest = [state] + ["0"] * 18 + [str(1000 + tid)] + ["0"] * 16 + [str(cpu), str(prio), str(policy)] + ["0"] * 11
        self.write(f"/proc/{pid}/task/{tid}/stat", f"{tid} ({comm}) " + " ".join(rest) + "\n")
        self.write(f"/proc/{tid}/stat", f"{tid} ({comm}) " + " ".join(rest) + "\n")   # threads show at /proc/TID too

    def schedstat(self, pid: int, tid: int, run_ns: int, wait_ns: int) -> None:
        self.write(f"/proc/{pid}/task/{tid}/schedstat", f"{run_ns} {wait_ns} 1\n")

    def freeze(self, cgroup: str, frozen: bool) -> None:
        self.write(f"{self.cg2}{cgroup}/cgroup.events", f"populated 1\nfrozen {int(frozen)}\n")


class FakeSched:
    """Thread scheduling attributes held in a dict: a SchedKnob's get/set for
    tests, so no test reaches a real thread."""

    def __init__(self, fail: dict | None = None):
        from cosched.actuators.sched import SchedAttr
        self.default = SchedAttr()
        self.attrs: dict[int, object] = {}
        self.calls: list[tuple[int, object]] = []
        self.refused: list[tuple[int, object]] = []   # the calls that failed
        self.fail = fail or {}            # policy name -> errno

    def get(self, tid):
        return self.attrs.get(tid, self.default)

    def set(self, tid, attr):
        if attr.policy in self.fail:
            import os
            self.refused.append((tid, attr))
            raise OSError(self.fail[attr.policy], os.strerror(self.fail[attr.policy]))
        self.calls.append((tid, attr))
        self.attrs[tid] = attr

    def knob(self, fs, clock=None, offset=None):
        """A knob on these attributes; the kernel's clock is not measured
        (``offset``: what :func:`cosched.actuators.sched.kernel_clock_offset` says)."""
        import time
        from cosched.actuators.sched import SchedKnob
        return SchedKnob(fs, get=self.get, put=self.set, clock=clock or time.monotonic_ns,
                         offset=offset or (lambda: None))


class ThreadSwitcher:
    """The real switch loop (``cosched.switcher.loop.serve``) in a thread of
    the test process, over pipes, shaped like the ``subprocess.Popen`` the
    engine normally gets: an Engine ``switcher_factory``."""

    def __init__(self, fs, sched_knob, realtime: bool = True):
        import io
        import threading

        from cosched.switcher.loop import serve
        from cosched.switcher.switcher import Switcher
        down_r, down_w = os.pipe()
        up_r, up_w = os.pipe()
        self.stdin = io.TextIOWrapper(os.fdopen(down_w, "wb"), write_through=True)
        self.stdout = os.fdopen(up_r, "r")
        self._up = os.fdopen(up_w, "w")
        self.pid = f"thread-{id(self)}"
        self.switcher = Switcher(fs, 500_000_000, sched=sched_knob)

        def run():
            try:
                serve(self.switcher, down_r, self._write, realtime)
            finally:
                os.close(down_r)
                self._up.close()
        self._thread = threading.Thread(target=run, name="test-switcher", daemon=True)
        self._thread.start()

    def _write(self, line):
        self._up.write(line)
        self._up.flush()

    def poll(self):
        return None if self._thread.is_alive() else 0

    def wait(self, timeout=None):
        self._thread.join(timeout)
        if self._thread.is_alive():
            import subprocess
            raise subprocess.TimeoutExpired("test-switcher", timeout)
        return 0

    def kill(self):
        self.stdin.close()

    @classmethod
    def factory(cls, fs, sched_knob):
        return lambda env: cls(fs, sched_knob)


class FakeAffinity:
    """Thread affinities, faked (no real thread is ever pinned): every
    thread on ``cpus`` until set; ``calls`` lists each set, in order."""

    def __init__(self, cpus=(0, 1)):
        self.now: dict[int, tuple] = {}
        self.calls: list[tuple[int, tuple]] = []
        self.default = tuple(cpus)

    def get(self, tid):
        return self.now.get(tid, self.default)

    def set(self, tid, cpus):
        self.calls.append((tid, tuple(cpus)))
        self.now[tid] = tuple(cpus)

    def knob(self, fs):
        return AffinityKnob(fs, get=self.get, set=self.set)


def reconcile(engine, snap):
    """What the daemon does with a snapshot of guests not under ``auto``:
    plan it with the engine's ``max_stall_ms``, and have the engine apply it."""
    from cosched.policy.plan import PlanConfig, plan
    return engine.reconcile(snap, plan(snap, PlanConfig(max_stall_ms=engine.max_stall_ms)))
