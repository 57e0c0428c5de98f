"""The scheduling guard.

``make test`` runs as root, so code under test could change the scheduling
policy of any host thread. :func:`install` wraps every way cosched changes
one (``os.sched_setscheduler``, ``os.sched_setparam``, ``os.sched_setaffinity``
and ``set_attr`` in :mod:`cosched.actuators.sched`, the one place that calls
``sched_setattr``)
and refuses, with EPERM, any target that is neither the calling process itself
(its threads, and child processes it started: the admission check's ``cat``)
nor a vCPU thread of a test guest (a QEMU process whose ``-name`` names a
guest ``cosched-*``). Each refusal is appended to ``$COSCHED_TEST_GUARD_LOG``,
and the test during which a line appeared fails (``tests/conftest.py``). The
test process installs it directly; every Python process the tests start gets
it through ``sitecustomize`` (this directory is on their ``PYTHONPATH``).
"""
from __future__ import annotations

import errno
import os
import re
import sys

_VCPU = re.compile(r"^CPU \d+/(KVM|TCG)$")
# /machine/qemu-ID-NAME.libvirt-qemu/ or /machine.slice/machine-qemu\x2dID\x2dNAME.scope/
_LIBVIRT_CGROUP = re.compile(rb"/(?:qemu-\d+-([^/]+)\.libvirt-qemu|machine-qemu\\x2d\d+\\x2d([^/]+)\.scope)/")
GUEST_PREFIX = b"cosched-"


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _field(tid: int, key: str) -> str:
    """A field of ``/proc/TID/status`` ("" when it cannot be read)."""
    return next((line.split()[1] for line in _read(f"/proc/{tid}/status").decode().splitlines()
                 if line.startswith(f"{key}:")), "")


def allowed(tid: int) -> str | None:
    """None when a scheduling change may reach ``tid``, else why not."""
    if tid == 0 or tid == os.getpid() or os.path.exists(f"/proc/{os.getpid()}/task/{tid}"):
        return None                                   # the caller itself (the switcher raising itself)
    if _field(tid, "PPid") == str(os.getpid()) and _field(tid, "Tgid") == str(tid):
        return None                                   # a child process the caller started: its own
    comm = _read(f"/proc/{tid}/comm").decode(errors="replace").strip()
    if not comm and not os.path.exists(f"/proc/{tid}"):
        return None                                   # gone: the call can only fail (ESRCH)
    if not _VCPU.match(comm):
        return f"tid {tid} ({comm or 'no such thread'}) is not a vCPU thread"
    tgid = _field(tid, "Tgid")
    if not tgid and not os.path.exists(f"/proc/{tid}"):
        return None                                   # exited since its name was read
    args = _read(f"/proc/{tgid}/cmdline").split(b"\0")
    # -name guest=NAME,... (libvirt) or -name NAME,... (Proxmox VE, hand-started)
    name = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == b"-name"), b"")
    name = name.split(b",")[0].removeprefix(b"guest=")
    if not name:       # an exiting QEMU has no command line left; its libvirt cgroup still names it
        m = _LIBVIRT_CGROUP.search(_read(f"/proc/{tid}/cgroup"))
        name = (m.group(1) or m.group(2)).replace(b"\\x2d", b"-") if m else b""
    if not name and _field(int(tgid), "PPid") == os.environ.get("COSCHED_TEST_SESSION_PID"):
        return None       # an exiting synthetic guest: the test session started it (testbed/synthetic.py)
    if not name.startswith(GUEST_PREFIX):
        return f"tid {tid} ({comm}) belongs to QEMU {tgid} ({name.decode(errors='replace') or '?'}), not a test guest"
    return None


def _refuse(what: str, tid: int, why: str) -> None:
    log = os.environ.get("COSCHED_TEST_GUARD_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"pid {os.getpid()} ({' '.join(sys.argv)[:80]}): {what}({tid}) refused: {why}\n")
    raise PermissionError(errno.EPERM, f"test guard: {what} on {why}")


def _wrap(name: str, call):
    def guarded(tid, *args):
        why = allowed(tid)
        if why:
            _refuse(name, tid, why)
        return call(tid, *args)
    guarded.__guarded__ = True
    return guarded


def guard_module(module) -> None:
    """Wrap the cosched sched actuator's system call."""
    if not getattr(module.set_attr, "__guarded__", False):
        module.set_attr = _wrap("sched_setattr", module.set_attr)


def _guard_setpriority(call):
    def guarded(which, who, prio):
        why = allowed(who) if which == os.PRIO_PROCESS else f"setpriority({which}, {who}): not a thread"
        if why:
            _refuse("os.setpriority", who, why)
        return call(which, who, prio)
    guarded.__guarded__ = True
    return guarded


def install() -> None:
    if not getattr(os.setpriority, "__guarded__", False):
        os.setpriority = _guard_setpriority(os.setpriority)
    for name in ("sched_setscheduler", "sched_setparam", "sched_setaffinity"):
        call = getattr(os, name)
        if not getattr(call, "__guarded__", False):
            setattr(os, name, _wrap(f"os.{name}", call))
    if "cosched.actuators.sched" in sys.modules:
        guard_module(sys.modules["cosched.actuators.sched"])
        return

    class Finder:
        """Wrap cosched.actuators.sched as soon as it is imported."""

        def find_spec(self, fullname, path, target=None):
            if fullname != "cosched.actuators.sched":
                return None
            sys.meta_path.remove(self)
            import importlib.util
            spec = importlib.util.find_spec(fullname)
            loader = spec.loader
            exec_module = loader.exec_module

            def exec_and_guard(module):
                exec_module(module)
                guard_module(module)
            loader.exec_module = exec_and_guard
            return spec

    sys.meta_path.insert(0, Finder())
