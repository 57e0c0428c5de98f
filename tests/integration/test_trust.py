"""An unprivileged user's QEMU is never managed, whatever it is named.

With ``sources = ["processes"]`` and ``default_policy = "auto"`` (every guest
found is cosched's to choose for), three processes run: the distribution's
QEMU started by root (a guest the platform started: the control, which the
daemon must find), a copy of that QEMU owned and run by ``nobody`` booting
the same guest, and a Python program run by ``nobody`` as
``qemu-system-x86_64 -name ...`` whose two threads spin, named ``CPU 0/KVM``
and ``CPU 1/KVM``. From outside, for as long as ``auto`` needs to decide,
neither of the user's processes has a thread pinned, boosted or moved to
another cgroup; the log names each once and the metric counts them.
"""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid as uuidlib
from pathlib import Path

import pytest

from .conftest import PREFIX, DaemonProcess

SPINNER = """
import ctypes, os, threading
def spin(i):
    with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
        f.write(f"CPU {i}/KVM")
    while True:
        pass
for i in range(2):
    threading.Thread(target=spin, args=(i,), daemon=True).start()
threading.Event().wait()
"""


def qemu_argv(exe: str, name: str, image, console: Path) -> list[str]:
    return [exe, "-name", f"guest={name},debug-threads=on", "-uuid", str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, name)),
            "-smp", "2", "-m", "96", "-accel", "tcg", "-nodefaults", "-display", "none", "-cpu", "qemu64",
            "-kernel", str(image.kernel), "-initrd", str(image.initrd),
            "-append", "console=ttyS0 quiet panic=-1 -- barrier interval_ms=100", "-serial", f"file:{console}"]


def threads(pid: int) -> dict[int, tuple]:
    """Each thread's affinity, scheduling policy and cgroup, now."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = (tuple(sorted(os.sched_getaffinity(int(tid)))), os.sched_getscheduler(int(tid)),
                             Path(f"/proc/{pid}/task/{tid}/cgroup").read_text())
        except (OSError, ProcessLookupError):
            pass
    return out


@pytest.fixture
def home():
    """A directory of the unprivileged user's (pytest's own are root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="cosched-it-trust-", dir="/tmp"))
    nobody = pwd.getpwnam("nobody")
    d.chmod(0o755)
    os.chown(d, nobody.pw_uid, nobody.pw_gid)
    yield d, nobody
    shutil.rmtree(d, ignore_errors=True)


def test_an_unprivileged_users_qemu_is_never_managed(libvirtd, guest_image, home, tmp_path):
    d, nobody = home
    copy = d / "qemu-system-x86_64"
    shutil.copy("/usr/bin/qemu-system-x86_64", copy)
    os.chown(copy, nobody.pw_uid, nobody.pw_gid)
    (d / "spin.py").write_text(SPINNER)
    def as_nobody(argv: list[str], argv0: str | None = None) -> subprocess.Popen:
        # a copy of QEMU finds its modules and firmware through these, not beside itself
        env = {**os.environ, "QEMU_MODULE_DIR": "/usr/lib/x86_64-linux-gnu/qemu"}
        return subprocess.Popen([argv0 or argv[0], *argv[1:]], executable=argv[0], user=nobody.pw_uid,
                                group=nobody.pw_gid, extra_groups=[], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    procs: dict[str, subprocess.Popen] = {}
    daemon = None
    try:
        procs["trusted"] = subprocess.Popen(
            qemu_argv("/usr/bin/qemu-system-x86_64", PREFIX + "trust-root", guest_image, tmp_path / "root.console"),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        procs["copy"] = as_nobody(qemu_argv(str(copy), PREFIX + "trust-copy", guest_image, d / "copy.console")
                                  + ["-L", "/usr/share/qemu", "-L", "/usr/share/seabios"])
        # a program that shows itself as QEMU: argv[0] qemu-system-x86_64, threads named CPU n/KVM
        procs["spinner"] = as_nobody(["/usr/bin/python3", str(d / "spin.py"), "-name", f"guest={PREFIX}trust-spin"],
                                     argv0="qemu-system-x86_64")
        time.sleep(2)
        for what in ("copy", "spinner"):
            assert procs[what].poll() is None, f"the user's {what} did not start"
            assert os.stat(f"/proc/{procs[what].pid}").st_uid == nobody.pw_uid
        assert Path(f"/proc/{procs['spinner'].pid}/cmdline").read_bytes().startswith(b"qemu-system-x86_64\0")
        before = {w: threads(procs[w].pid) for w in ("copy", "spinner")}
        (tmp_path / "daemon").mkdir()
        daemon = DaemonProcess(tmp_path / "daemon", extra_config='sources = ["processes"]\n'
                                                                 'default_policy = "auto"\n').start()
        daemon.wait(lambda: daemon.domain(PREFIX + "trust-root"), 20, "the root-started QEMU found")
        end = time.monotonic() + 12                      # auto decides within a few seconds of evidence
        while time.monotonic() < end:
            for w in ("copy", "spinner"):
                now = threads(procs[w].pid)
                changed = {t: (before[w][t], v) for t, v in now.items() if t in before[w] and before[w][t] != v}
                assert not changed, f"the user's {w} was changed by the daemon: {changed}"
            time.sleep(0.2)
        names = {dom["name"] for dom in daemon.status()["domains"]}
        metrics = daemon.metrics()
        log = daemon.log.read_text()
    finally:
        code = daemon.stop() if daemon is not None else 0
        for p in procs.values():
            try:
                os.killpg(p.pid, 9)
            except ProcessLookupError:
                pass
            p.wait()
    assert code == 0
    assert PREFIX + "trust-root" in names and not names & {PREFIX + "trust-copy", PREFIX + "trust-spin"}, names
    for w in ("copy", "spinner"):
        said = [line for line in log.splitlines() if f"pid={procs[w].pid} " in line and "action=process-ignored" in line]
        assert len(said) == 1 and "reason=executable" in said[0], said
    assert 'cosched_ignored_processes{reason="executable"} 2.0' in metrics, metrics[-2000:]
