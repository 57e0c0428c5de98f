"""Boot, watch and remove tiny test guests from ``vm-templates/``.

Guests are transient libvirt domains (``createXML``): destroying one removes
it. Each writes its serial console to a file, from which
:meth:`Guest.results` reads the workload's ``cosched-result`` lines;
:meth:`Guest.counters` reads its live counters straight from the guest's
memory, at the instant of the call.

The domain type is ``kvm`` when the host can really run KVM guests
(``/dev/kvm`` and the ``vmx``/``svm`` CPU flag) and ``qemu`` (TCG) otherwise;
``COSCHED_TESTBED_ACCEL=kvm|tcg`` forces one.
"""
from __future__ import annotations

import os
import re
import struct
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from string import Template

import libvirt

from testbed.image import CACHE_DIR, GuestImage, build

TEMPLATES = Path(__file__).resolve().parents[1] / "vm-templates"
CONSOLE_DIR = CACHE_DIR / "console"
NAMESPACE = "urn:cosched:libvirt:1"
_RESULT = re.compile(r"cosched-result (.*)")
_COUNTERS = re.compile(r"cosched-counters gpa=0x([0-9a-f]+) magic=0x([0-9a-f]+)\n")
PAGE = 4096
URI = "qemu:///system"
SILENT_BOOT_S = 30           # a guest silent this long after wait_for began is booted again (see there)
_conn: libvirt.virConnect | None = None


def connection() -> libvirt.virConnect:
    """A shared connection to libvirtd, reopened after libvirtd restarts."""
    global _conn
    try:
        if _conn is not None:
            _conn.getLibVersion()   # a round trip: fails once libvirtd restarted
            return _conn
    except libvirt.libvirtError:
        pass
    _conn = libvirt.open(URI)
    return _conn


def domain_type() -> str:
    forced = os.environ.get("COSCHED_TESTBED_ACCEL", "auto")
    if forced in ("kvm", "tcg"):
        return "kvm" if forced == "kvm" else "qemu"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        flags = ""
    has_vt = re.search(r"^flags\s*:.*\b(vmx|svm)\b", flags, re.M) is not None
    return "kvm" if os.path.exists("/dev/kvm") and has_vt else "qemu"


def annotation(preset: str | None, **params) -> str:
    """The ``<cosched:policy>`` element for ``preset`` (None: no annotation)."""
    if preset is None:
        return ""
    attrs = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in params.items())
    return f'<cosched:policy xmlns:cosched="{NAMESPACE}" name="{preset}"{attrs}/>'


def domain_xml(name: str, *, vcpus: int = 2, max_vcpus: int | None = None, memory_mib: int = 96,
               workload: str = "barrier",
               policy: str = "", image: GuestImage | None = None, console_log: Path | None = None,
               template: str = "tiny.xml", cputune: str = "") -> str:
    image = image or build()
    text = (TEMPLATES / template).read_text()
    return Template(text).substitute(
        name=name, type=domain_type(), vcpus=vcpus, max_vcpus=max(max_vcpus or vcpus, vcpus), memory_mib=memory_mib,
        kernel=image.kernel, initrd=image.initrd,
        console_log=console_log or CONSOLE_DIR / f"{name}.log",
        workload=workload, annotation=policy, cputune=cputune,
    )


@dataclass
class Guest:
    name: str
    console_log: Path
    _parsed: int = field(default=0, repr=False)           # console bytes already parsed
    _results: list = field(default_factory=list, repr=False)
    _live: tuple | None = field(default=None, repr=False)      # (QEMU pid, address of the counter page, magic)
    _page: tuple | None = field(default=None, repr=False)      # (guest-physical address, magic): kept across a
                                                               # restore, whose QEMU starts a new console file
    xml: str = field(default="", repr=False)                   # what it was started from: see wait_for

    @property
    def dom(self) -> libvirt.virDomain:
        return connection().lookupByName(self.name)

    def console(self) -> str:
        try:
            return self.console_log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def results(self) -> list[dict]:
        """Every ``cosched-result`` line so far: integer counters as ``{key: int}``,
        and ``hist`` (iteration times) as ``{bucket: count}``.

        Only complete lines count (one the guest is still writing could carry a
        counter cut short), and each is parsed once: the console is read from
        where the last call stopped."""
        try:
            with open(self.console_log, "rb") as f:
                f.seek(self._parsed)
                new = f.read()
        except FileNotFoundError:
            return []
        end = new.rfind(b"\n") + 1
        self._parsed += end
        for m in _RESULT.finditer(new[:end].decode(errors="replace")):
            try:
                line: dict = {}
                for k, v in (kv.split("=", 1) for kv in m.group(1).split()):
                    if k == "hist":
                        line[k] = {int(b): int(n) for b, n in (p.split(":") for p in v.split(","))}
                    elif v.isdigit():
                        line[k] = int(v)
            except ValueError:
                continue        # a line the guest kernel's output broke into
            if "t_ms" in line and "iters" in line:
                self._results.append(line)
        return list(self._results)

    def counters(self) -> dict[str, int] | None:
        """The workload's counters now (``iters``, ``missed``, ``errors``,
        summed over its threads), read from guest memory through QEMU's
        ``/proc/PID/mem``: exact at the instant of the call whether or not a
        vCPU of the guest is running. None while the guest has not said
        where they are, or when it cannot (see ``guest-init.c``).

        The page's guest-physical address comes from the console (the one
        read last: a restored guest's console starts empty); guest RAM
        is QEMU's one anonymous read-write mapping of the guest's memory
        size, and low guest-physical memory lies at the same offset in it
        (x86 ``pc`` machines, guests under 3 GiB). The header's magic is
        checked on every read, so a wrong mapping or a moved page reads as
        an error, never as a count."""
        if self._live is None:
            m = ([None] + list(_COUNTERS.finditer(self.console())))[-1]   # a rebooted guest's newest
            if m:
                self._page = (int(m.group(1), 16), int(m.group(2), 16))
            if self._page is None:
                return None
            pid = qemu_pid(self.name)
            size = self.dom.maxMemory() * 1024
            gpa, magic = self._page
            for base in _anonymous_mappings(pid, size):
                if _read_live(pid, base + gpa, magic) is not None:
                    self._live = (pid, base + gpa, magic)
                    break
            else:
                raise RuntimeError(f"{self.name}: no mapping of {size} bytes holds the counter page at {gpa:#x}")
        counts = _read_live(*self._live)
        if counts is None:
            raise RuntimeError(f"{self.name}: the counter page no longer holds its magic")
        return counts

    def wait_for(self, text: str, timeout: float = 60.0) -> None:
        """Wait until ``text`` stands on a complete console line: a line the guest
        is still writing does not count (its result counters may be cut short).

        A guest whose console is still empty after ``SILENT_BOOT_S`` is booted
        once more (said on stderr): once in five runs of ``make test`` a TCG
        guest booting alone printed nothing for a minute, its serial file
        empty, where in the other runs the same guest was started, measured
        and destroyed within 20 s. Booting is not what any test here
        examines."""
        start = time.monotonic()
        deadline = start + timeout
        while text not in self.console().rpartition("\n")[0]:
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"{self.name}: {text!r} not on the console after {timeout}s:\n{self.console()[-2000:]}")
            if self.xml and now - start > SILENT_BOOT_S and not self.console():
                print(f"testbed: {self.name} printed nothing in {SILENT_BOOT_S} s: booting it once more", file=sys.stderr)
                self.destroy()
                connection().createXML(self.xml, 0)
                self.xml, self._live = "", None
            time.sleep(0.2)

    def destroy(self) -> None:
        try:
            self.dom.destroy()
        except libvirt.libvirtError:
            pass


def _anonymous_mappings(pid: int, size: int) -> list[int]:
    """Start addresses of the process's anonymous read-write mappings of ``size`` bytes."""
    out = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split()
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        if hi - lo == size and fields[1].startswith("rw") and len(fields) == 5:
            out.append(lo)
    return out


def _read_live(pid: int, address: int, magic: int) -> dict[str, int] | None:
    """The counter page at ``address`` in QEMU's memory, summed; None without the magic."""
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as f:
        f.seek(address)
        page = f.read(PAGE)
    head, threads = struct.unpack_from("<QQ", page)
    if head != magic or not 0 < threads <= (PAGE - 64) // 64:
        return None
    per = [struct.unpack_from("<QQQ", page, 64 + 64 * i) for i in range(threads)]
    return {k: sum(t[j] for t in per) for j, k in enumerate(("iters", "missed", "errors"))}


def start(name: str, **kw) -> Guest:
    """Boot a transient guest (see :func:`domain_xml` for the options)."""
    CONSOLE_DIR.mkdir(parents=True, exist_ok=True)
    log = CONSOLE_DIR / f"{name}.log"
    log.unlink(missing_ok=True)
    xml = domain_xml(name, console_log=log, **kw)
    connection().createXML(xml, 0)
    return Guest(name, log, xml=xml)


@contextmanager
def paused(gs: list[Guest]):
    """Guests paused by libvirt (their clocks stand still), resumed on exit. Boot a
    guest with the busy ones paused: on a 2-CPU host busy guests under the host
    scheduler can starve a booting one past any timeout."""
    for g in gs:
        g.dom.suspend()
    try:
        yield
    finally:
        for g in gs:
            try:
                if g.dom.info()[0] == libvirt.VIR_DOMAIN_PAUSED:
                    g.dom.resume()
            except libvirt.libvirtError:
                pass


def destroy_all(prefix: str) -> None:
    """Destroy every running domain whose name starts with ``prefix``."""
    for dom in connection().listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
        if dom.name().startswith(prefix):
            try:
                dom.destroy()
            except libvirt.libvirtError:
                pass


def throughput(results: list[dict[str, int]], since_ms: int = 0) -> float:
    """Iterations per second between the first result at/after ``since_ms``
    (guest clock) and the last one."""
    rs = [r for r in results if r.get("t_ms", 0) >= since_ms]
    if len(rs) < 2:
        return 0.0
    first, last = rs[0], rs[-1]
    return (last["iters"] - first["iters"]) * 1000.0 / max(last["t_ms"] - first["t_ms"], 1)


def cgroup_mounts() -> tuple[str, str | None]:
    """(cgroup v2 mount, v1 cpu controller mount or None) of this host."""
    from cosched.hostfs import HostFS, find_mount, mounts
    found = mounts(HostFS("/"))
    v2 = find_mount(found, "cgroup2")
    if v2 is None:
        raise RuntimeError("no cgroup2 mount in /proc/self/mountinfo")
    return v2, find_mount(found, "cgroup", "cpu")


def qemu_pid(name: str) -> int:
    """The running guest's QEMU process, from libvirt's pid file."""
    return int(Path(f"/run/libvirt/qemu/{name}.pid").read_text())


def vcpu_threads(name: str) -> dict[int, int]:
    """The running guest's vCPU threads, ``{tid: vCPU index}``, by thread name."""
    pid = qemu_pid(name)
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        m = re.match(r"CPU (\d+)/", Path(f"/proc/{pid}/task/{tid}/comm").read_text())
        if m:
            out[int(tid)] = int(m.group(1))
    return out


def vcpu_cgroups(name: str) -> dict[str, list[str]]:
    """Where libvirt put the running guest's vCPU threads, read from each
    thread's ``/proc/TID/cgroup`` (no assumed layout): ``{"v2": [dirs], "cpu":
    [dirs]}``, host paths, one per vCPU thread. Raises when the guest has no
    vCPU thread in a ``vcpuN`` v2 cgroup, so no caller can pass on nothing."""
    v2_mount, cpu_mount = cgroup_mounts()
    out: dict[str, list[str]] = {"v2": [], "cpu": []}
    for tid in sorted(vcpu_threads(name)):
        for line in Path(f"/proc/{tid}/cgroup").read_text().splitlines():
            hier, ctrls, path = line.split(":", 2)
            if hier == "0" and re.search(r"/vcpu\d+$", path):
                out["v2"].append(v2_mount + path)
            elif cpu_mount and "cpu" in ctrls.split(",") and re.search(r"/vcpu\d+$", path):
                out["cpu"].append(cpu_mount + path)
    if not out["v2"]:
        raise AssertionError(f"{name}: no vCPU thread in a vcpuN cgroup of the v2 tree")
    return out


def confine(name: str, cpus: str) -> None:
    """Narrow the running guest's cgroup cpuset to ``cpus`` under libvirt,
    as a platform that confines a guest's cgroup does (a KubeVirt pod, a
    restricted slice): its child cgroups first, as the v1 cpuset requires.
    Only the v1 cpuset hierarchy is supported (hosts like these)."""
    from cosched.hostfs import HostFS, mount_point
    mount = mount_point(HostFS("/"), "cgroup", "cpuset")
    if mount is None:
        raise RuntimeError("no v1 cpuset hierarchy here")
    tid = next(iter(vcpu_threads(name)))
    path = next(line.split(":", 2)[2] for line in Path(f"/proc/{tid}/cgroup").read_text().splitlines()
                if "cpuset" in line.split(":")[1].split(","))
    scope = Path(mount + re.sub(r"/vcpu\d+$", "", path))
    for child in [c for c in scope.iterdir() if c.is_dir()] + [scope]:
        (child / "cpuset.cpus").write_text(cpus)
