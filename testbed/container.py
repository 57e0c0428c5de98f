"""A Debian 12 system with systemd as PID 1, booted by systemd-nspawn.

The development hosts have no systemd as PID 1, yet the unit, ``Type=notify``,
the watchdog, ``systemctl reload``, ``ExecStopPost`` and the sandboxing
options only mean something under a real systemd. This boots one:

* :func:`build_root` makes the tree once with ``debootstrap --variant=minbase``
  (systemd, D-Bus, machined, libvirt, QEMU, Python with Debian's libvirt
  binding, make) and caches it under ``/var/cache/cosched-testbed/``;
* :class:`Container` boots it with ``systemd-nspawn -b --register=no
  --keep-unit --volatile=overlay`` (the cached tree stays read-only; every
  change goes to a tmpfs and is gone at shutdown), the repository copied to
  ``/src``, the test guest image at ``/image`` and a wheelhouse for ``pip`` at
  ``/wheels``, and runs commands inside with ``nsenter``.

Without ``--register=no --keep-unit`` nspawn looks for the host's D-Bus and
machined, which hosts without systemd lack.

Two things differ from a production host, both measured on the development
hosts (hybrid cgroups: every controller bound to a v1 hierarchy):

* nspawn mounts the v1 controllers read-only, and libvirt then fails to start
  a guest ("Failed to create v1 controller cpu for group: Read-only file
  system"); :meth:`Container.writable_controllers` remounts them read-write
  inside the container (a bind remount: the host's mounts are untouched).
* libvirt with machined puts each guest in a real
  ``machine.slice/machine-qemu\x2dN\x2dNAME.scope``, but in the v2 tree it
  creates no per-vCPU cgroups: its v2 backend claims no controllers (v2 has
  none here), and in a pure v2 container it creates no scope at all. On a
  pure v2 host with controllers it adds ``libvirt/emulator`` and threaded
  ``libvirt/vcpuN`` under the scope; :meth:`Container.split_vcpus` creates
  exactly those and moves the guest's threads in, through the same
  ``cgroup.type``/``cgroup.threads`` interface libvirt uses.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from testbed.image import CACHE_DIR

RELEASE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# libpam-systemd: debootstrap does not resolve polkitd's "default-logind | logind"
PACKAGES = ("systemd", "systemd-sysv", "dbus", "libpam-systemd", "systemd-container", "libvirt-daemon-system", "libvirt-clients",
            "qemu-system-x86", "python3", "python3-venv", "python3-libvirt", "python3-prometheus-client", "make",
            "ca-certificates", "procps")
ROOT = CACHE_DIR / f"systemd-{RELEASE}"
WHEELS = CACHE_DIR / "wheels"
STAMP = ".cosched-testbed-root"


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def build_root(root: Path = ROOT) -> Path:
    """The cached container tree, made on first use (several minutes)."""
    want = " ".join(PACKAGES)
    stamp = root / STAMP
    if stamp.exists() and stamp.read_text() == want:
        return root
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    debs = CACHE_DIR / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    r = run(["debootstrap", "--variant=minbase", f"--cache-dir={debs}", f"--include={','.join(PACKAGES)}",
             RELEASE, str(tmp), MIRROR])
    if r.returncode != 0:
        raise RuntimeError(f"debootstrap failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    # no login prompts, no units that cannot work in a container or are not needed
    for unit in ("getty.target", "console-getty.service", "systemd-networkd.service", "apt-daily.timer",
                 "apt-daily-upgrade.timer", "libvirt-guests.service"):
        mask = tmp / "etc/systemd/system" / unit
        mask.parent.mkdir(parents=True, exist_ok=True)
        mask.unlink(missing_ok=True)
        mask.symlink_to("/dev/null")
    (tmp / STAMP).write_text(want)
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    return root


FROM_DEBIAN = ("libvirt-python", "prometheus-client")   # make install takes these from Debian (python3-libvirt, ...)


def runtime_requirements() -> list[str]:
    """The package's own requirements (setup.cfg), less those Debian provides, for this Python."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).resolve().parents[1] / "setup.cfg")
    out = []
    for req in filter(None, (r.strip() for r in cfg["options"]["install_requires"].splitlines())):
        spec, _, marker = req.partition(";")
        if spec.split(">")[0].split("=")[0].strip() in FROM_DEBIAN:
            continue
        if "python_version < \"3.11\"" in marker and sys.version_info >= (3, 11):
            continue
        out.append(spec.strip())
    return out


def wheelhouse() -> Path:
    """The wheels ``pip install .`` needs inside the container, fetched on the host."""
    WHEELS.mkdir(parents=True, exist_ok=True)
    requirements = runtime_requirements() + ["setuptools>=61", "wheel", "pip"]
    r = run([sys.executable, "-m", "pip", "download", "-q", "-d", str(WHEELS), *requirements])
    if r.returncode != 0 and not any(WHEELS.glob("setuptools-*.whl")):
        raise RuntimeError(f"pip download failed: {r.stderr[-2000:]}")
    return WHEELS


SPLIT_VCPUS = r"""
import os, re, sys
name = sys.argv[1]
pid = int(open(f"/run/libvirt/qemu/{name}.pid").read())
mount = next(l.split()[4] for l in open("/proc/self/mountinfo") if " - cgroup2 " in l)
scope = next(l[3:].strip() for l in open(f"/proc/{pid}/cgroup") if l.startswith("0::"))
assert scope.endswith(".scope"), scope
base = f"{mount}{scope}/libvirt"
os.makedirs(base, exist_ok=True)
open(f"{base}/cgroup.procs", "w").write(str(pid))
threads = {}
for tid in os.listdir(f"/proc/{pid}/task"):
    m = re.match(r"CPU (\d+)/", open(f"/proc/{pid}/task/{tid}/comm").read())
    threads[tid] = f"vcpu{m.group(1)}" if m else "emulator"
for child in sorted(set(threads.values())):
    os.makedirs(f"{base}/{child}", exist_ok=True)
    open(f"{base}/{child}/cgroup.type", "w").write("threaded")
for tid, child in threads.items():
    open(f"{base}/{child}/cgroup.threads", "w").write(tid)
"""


class Container:
    """A booted container; ``exec`` runs a command in it."""

    def __init__(self, root: Path, src: Path, image_dir: Path, wheels: Path, log: Path, binds: tuple[str, ...] = ()):
        """``binds``: more ``--bind=`` arguments (``HOST[:INSIDE]``)."""
        self.root, self.src, self.image_dir, self.wheels, self.log = root, src, image_dir, wheels, log
        self.binds = binds
        self.proc: subprocess.Popen | None = None
        self.leader: int | None = None
        self.env: dict[str, str] = {}
        self._v1_before: set[str] = set()

    def start(self, timeout: float = 120.0) -> "Container":
        self._v1_before = set(_v1_machine_slices())
        self.proc = subprocess.Popen(
            ["systemd-nspawn", "--quiet", "--boot", "--directory", str(self.root), "--register=no", "--keep-unit",
             "--volatile=overlay", "--console=passive", "--machine=cosched-test",
             "--capability=CAP_BPF,CAP_PERFMON", "--system-call-filter=bpf",   # cosched's in-kernel meter
             f"--bind={self.src}:/src", f"--bind-ro={self.image_dir}:/image", f"--bind-ro={self.wheels}:/wheels",
             *(f"--bind={b}" for b in self.binds)],
            stdin=subprocess.DEVNULL, stdout=open(self.log, "w"), stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **self.env})
        deadline = time.monotonic() + timeout
        while self.leader is None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"systemd-nspawn exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no container init after {timeout}s:\n{self.log.read_text()[-3000:]}")
            kids = [int(c) for t in os.listdir(f"/proc/{self.proc.pid}/task")
                    for c in Path(f"/proc/{self.proc.pid}/task/{t}/children").read_text().split()]
            self.leader = kids[0] if kids else None
            time.sleep(0.2)
        while True:
            state = self.exec("systemctl", "is-system-running").stdout.strip()
            if state in ("running", "degraded"):
                return self
            if time.monotonic() > deadline:
                failed = self.exec("systemctl", "--failed", "--no-legend").stdout
                raise TimeoutError(f"container system state {state!r}; failed units:\n{failed}")
            time.sleep(0.5)

    def writable_controllers(self) -> None:
        """Remount the v1 controller hierarchies read-write inside the container."""
        self.exec("sh", "-c", "for m in $(findmnt -n -t cgroup -o TARGET); do "
                  "case $m in */systemd) ;; *) mount -o remount,bind,rw $m ;; esac; done", check=True)

    def split_vcpus(self, name: str) -> None:
        """Give guest ``name`` libvirt's pure-v2 layout under its machine scope:
        the process in ``SCOPE/libvirt``, threads in threaded ``emulator`` and ``vcpuN``."""
        self.exec("python3", "-c", SPLIT_VCPUS, name, check=True)

    def exec(self, *cmd: str, timeout: float = 300, check: bool = False) -> subprocess.CompletedProcess:
        """Run ``cmd`` inside, with a clean environment."""
        r = subprocess.run(["nsenter", "--target", str(self.leader), "--all", "--",
                            "env", "-i", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                            "LANG=C.UTF-8", *cmd], capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        return r

    def stop(self, timeout: float = 60.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        if self.leader is not None:
            self.exec("sh", "-c", "for d in $(virsh -c qemu:///system list --name); do "
                      "virsh -c qemu:///system destroy $d; done", timeout=60)
            try:
                os.kill(self.leader, signal.SIGRTMIN + 3)      # systemd: halt
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        # the guests' v1 cgroups sit in the host's hierarchies (writable_controllers): take away what is left
        for top in set(_v1_machine_slices()) - self._v1_before:
            for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -w[0].count("/")):
                try:
                    os.rmdir(dirpath)
                except OSError:
                    pass


def _v1_machine_slices() -> list[str]:
    import glob
    return glob.glob("/sys/fs/cgroup/*/machine.slice")
