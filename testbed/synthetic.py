"""Synthetic guests: processes that look like QEMU guests to cosched, for scale.

A real TCG guest costs ~100 MB and seconds to boot, so a 2-CPU test host holds
a handful. A synthetic guest is one process (``testbed/workloads/synthetic-qemu.c``)
whose command line reads like QEMU's (``qemu-system-x86_64 -name
guest=NAME,debug-threads=on -uuid UUID -id VMID -smp N``) and whose N threads
are named ``CPU n/KVM`` and run a workload (``spin``, ``barrier``, ``sleep``).
:func:`start` then lays its threads out in cgroups exactly as libvirt lays out
a guest's, in one of two layouts:

``libvirt``
    ``/machine/qemu-ID-NAME.libvirt-qemu/{emulator,vcpuN}`` (libvirt on a host
    without systemd, as on the development machines);
``machine.slice``
    ``/machine.slice/machine-qemu\\x2dID\\x2dNAME.scope/libvirt/{emulator,vcpuN}``
    (libvirt under systemd with machined);

in the cgroup v2 tree (``vcpuN`` and ``emulator`` threaded, the guest's cgroup
their threaded domain, as libvirt makes them) and, on hybrid hosts, in the v1
``cpu`` controller too (where RT group scheduling lives).

cosched's ``processes`` source finds them as it finds any QEMU process no host
libvirtd runs, and reads the policy from a Proxmox VE style ``VMID.conf`` tag
(``tags=`` below, written to ``pve_dir``): discovery, engine and switcher run
the same code paths as for real guests. Real libvirt guests stay the ground
truth for what this cannot show (guest kernels, real vCPU exits).

Binaries are cached under ``CACHE_DIR/synthetic-<hash>``. Names should start
with ``cosched-`` (the test guard lets tests act on those threads only).
"""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
import uuid as uuidlib
from dataclasses import dataclass, field
from pathlib import Path

from testbed.guests import cgroup_mounts
from testbed.image import CACHE_DIR

SOURCE = Path(__file__).resolve().parent / "workloads" / "synthetic-qemu.c"
LAYOUTS = ("libvirt", "machine.slice")


def trust_config(cache_dir: Path = CACHE_DIR) -> str:
    """The daemon configuration line that lets the ``processes`` source take
    synthetic guests for QEMU (their binary is no emulator the defaults name:
    :mod:`cosched.trust`), beside the default emulators."""
    from cosched.trust import EMULATORS
    return "emulators = [" + ", ".join(f'"{g}"' for g in (*EMULATORS, f"{cache_dir}/synthetic-*")) + "]\n"


def build(cache_dir: Path = CACHE_DIR) -> Path:
    """The compiled synthetic guest, built once per source version."""
    key = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    binary = cache_dir / f"synthetic-{key}"
    if not binary.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        part = binary.with_suffix(".part")
        subprocess.run(["gcc", "-O2", "-pthread", "-o", str(part), str(SOURCE)], check=True, capture_output=True)
        part.rename(binary)
    return binary


def guest_cgroup(layout: str, vmid: int, name: str) -> str:
    """The guest's cgroup (the threaded domain of its vCPU cgroups), as libvirt names it."""
    if layout == "libvirt":
        return f"/machine/qemu-{vmid}-{name}.libvirt-qemu"
    if layout == "machine.slice":
        return f"/machine.slice/machine-qemu\\x2d{vmid}\\x2d{name.replace('-', chr(92) + 'x2d')}.scope/libvirt"
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


@dataclass
class SyntheticGuest:
    name: str
    uuid: str
    vmid: int
    vcpus: int
    layout: str
    proc: subprocess.Popen
    log: Path
    tids: dict[int, int] = field(default_factory=dict)      # vCPU index -> TID
    cgroups: list[str] = field(default_factory=list)        # its own directories, parents first
    parents: list[str] = field(default_factory=list)        # shared parents it had to make (/machine, ...)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def iterations(self) -> int | None:
        """The last total the guest printed (it prints every second)."""
        lines = [ln for ln in self.log.read_text().splitlines() if ln.startswith("synthetic iters=")]
        return int(lines[-1].split("=", 1)[1]) if lines else None

    def destroy(self) -> None:
        """Stop the process (thawing it first) and remove its cgroups."""
        for d in self.cgroups:
            freeze = Path(d) / "cgroup.freeze"
            if freeze.exists():
                try:
                    freeze.write_text("0")
                except OSError:
                    pass
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        remove_cgroups(self.cgroups)
        _remove_empty(self.parents)


def remove_cgroups(dirs: list[str]) -> None:
    """Remove a guest's own cgroups (``SyntheticGuest.cgroups``, children
    last in the list) once its threads have left them."""
    for d in reversed(dirs):
        for _ in range(50):
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.02)           # the exiting threads are leaving it


def _remove_empty(dirs: list[str]) -> None:
    for d in reversed(dirs):
        try:
            os.rmdir(d)                        # only once no other guest uses it
        except OSError:
            pass


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _mkdirs(path: str, own: list[str], parents: list[str]) -> None:
    """Make ``path`` (the guest's own) and any missing parent (shared)."""
    missing = []
    p = path
    while not os.path.isdir(p):
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        os.mkdir(d)
        (own if d == path else parents).append(d)


def start(name: str, vcpus: int = 2, workload: str = "sleep", layout: str = "libvirt", vmid: int | None = None,
          pve_dir: str | None = None, tags: str | None = None, workdir: Path | None = None,
          sleep_ms: int = 1) -> SyntheticGuest:
    """Start a synthetic guest and place its threads as libvirt would; with
    ``pve_dir`` and ``tags`` also write its ``VMID.conf``. ``sleep_ms``: how
    long a ``sleep`` thread sleeps between its short computations.

    The guest runs in a session of its own (a test's signals do not reach
    it) but is killed when the thread that started it ends, however it
    ends: start guests from a thread that outlives them. Its cgroups stay
    behind a caller killed by a signal (:func:`remove_cgroups`)."""
    binary = build()
    vmid = vmid if vmid is not None else 1000 + (abs(hash(name)) % 9000)
    guid = str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, name))
    if pve_dir is not None:
        Path(pve_dir).mkdir(parents=True, exist_ok=True)
        Path(pve_dir, f"{vmid}.conf").write_text(f"cores: {vcpus}\n" + (f"tags: {tags}\n" if tags else ""))
    log = (workdir or Path("/tmp")) / f"{name}.out"
    argv = ["qemu-system-x86_64", "-name", f"guest={name},debug-threads=on", "-uuid", guid, "-id", str(vmid),
            "-smp", str(vcpus), "-workload", workload, "-sleep-ms", str(sleep_ms), "-parent", str(os.getpid())]
    proc = subprocess.Popen(argv, executable=str(binary), stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    g = SyntheticGuest(name, guid, vmid, vcpus, layout, proc, log)
    try:
        deadline = time.monotonic() + 10
        while "synthetic ready" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start: {log.read_text()[-500:]}")
            time.sleep(0.01)
        for tid in os.listdir(f"/proc/{proc.pid}/task"):
            comm = Path(f"/proc/{proc.pid}/task/{tid}/comm").read_text().strip()
            if comm.startswith("CPU ") and comm.endswith("/KVM"):
                g.tids[int(comm.split()[1].split("/")[0])] = int(tid)
        if len(g.tids) != vcpus:
            raise RuntimeError(f"{name}: found {len(g.tids)} vCPU threads of {vcpus}")
        _place(g)
    except BaseException:
        g.destroy()
        raise
    return g


def _place(g: SyntheticGuest) -> None:
    """Move the threads into ``emulator`` and ``vcpuN`` cgroups (v2 threaded; v1 cpu too)."""
    v2, cpu = cgroup_mounts()
    base = guest_cgroup(g.layout, g.vmid, g.name)
    domain = f"{v2}{base}"
    _mkdirs(domain, g.cgroups, g.parents)
    _write(f"{domain}/cgroup.procs", str(g.pid))
    children = ["emulator"] + [f"vcpu{i}" for i in sorted(g.tids)]
    for child in children:
        os.mkdir(f"{domain}/{child}")
        g.cgroups.append(f"{domain}/{child}")
        _write(f"{domain}/{child}/cgroup.type", "threaded")
    _write(f"{domain}/emulator/cgroup.threads", str(g.pid))
    for index, tid in g.tids.items():
        _write(f"{domain}/vcpu{index}/cgroup.threads", str(tid))
    if cpu and cpu != v2:
        v1 = f"{cpu}{base}"
        _mkdirs(v1, g.cgroups, g.parents)
        for child in children:
            os.mkdir(f"{v1}/{child}")
            g.cgroups.append(f"{v1}/{child}")
        _write(f"{v1}/emulator/tasks", str(g.pid))
        for index, tid in g.tids.items():
            _write(f"{v1}/vcpu{index}/tasks", str(tid))


def destroy_all(guests: list[SyntheticGuest]) -> None:
    for g in guests:
        g.destroy()
    _remove_empty([d for g in guests for d in g.parents])
