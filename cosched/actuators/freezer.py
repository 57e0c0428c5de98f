"""Freeze and thaw vCPU threads through cgroup v2 ``cgroup.freeze``.

libvirt puts each vCPU thread in its own threaded cgroup (``.../vcpuN``) in
the v2 tree, on pure v2 and hybrid hosts alike, so one vCPU can be stopped
without touching its siblings. Writing ``1`` asks the kernel to freeze; the
cgroup is frozen once ``cgroup.events`` says ``frozen 1`` (about 0.1 ms for one
vCPU). Thawing (``0``) takes effect at once.
"""
from __future__ import annotations

import time

from cosched.hostfs import HostFS


def set_frozen(fs: HostFS, path: str, frozen: bool) -> None:
    """Write ``cgroup.freeze``; OSError (ENOENT when the vCPU is gone) propagates."""
    fs.write(path, "1" if frozen else "0")


def is_frozen(fs: HostFS, freeze_file: str) -> bool:
    events = fs.read(freeze_file.rsplit("/", 1)[0] + "/cgroup.events")
    return "frozen 1" in events.splitlines()


def wait_frozen(fs: HostFS, freeze_files: list[str], frozen: bool, timeout: float = 0.05,
                pause: float = 0.00005) -> list[str]:
    """Poll ``cgroup.events`` until each cgroup reaches ``frozen``; return the laggards.

    A thread freezes only when it runs (it traps on its way back to user
    space), and the caller may be the very task keeping it off its CPU, so
    the wait sleeps ``pause`` between looks instead of spinning.
    """
    pending = list(freeze_files)
    deadline = time.monotonic() + timeout
    first = True
    while pending:
        if not first:
            time.sleep(pause)
        first = False
        still = []
        for path in pending:
            try:
                if is_frozen(fs, path) != frozen:
                    still.append(path)
            except OSError:
                pass                      # gone: nothing to wait for
        pending = still
        if not pending or time.monotonic() > deadline:
            break
    return pending
