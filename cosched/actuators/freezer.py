"""Freeze and thaw vCPU threads through cgroup v2 ``cgroup.freeze``.

libvirt puts each vCPU thread in its own threaded cgroup (``.../vcpuN``) in
the v2 tree, on pure v2 and hybrid hosts alike, so one vCPU can be stopped
without touching its siblings. Writing ``1`` asks the kernel to freeze; the
cgroup is frozen once ``cgroup.events`` says ``frozen 1`` (about 0.1 ms for one
vCPU). Thawing (``0``) takes effect at once.

The journal entry (kind ``freeze``) holds the file's value before cosched's
first write; restoring writes it back.
"""
from __future__ import annotations

import contextlib
import time

from cosched.actuators.journal import FileKnob, Target
from cosched.hostfs import HostFS, OpenFile
from cosched.kernel import events_frozen

KIND = "freeze"


def events_file(freeze_file: str) -> str:
    return freeze_file.rsplit("/", 1)[0] + "/cgroup.events"


class Freezer:
    """Freeze and thaw vCPU cgroups on the switcher's hot path.

    Each cgroup's ``cgroup.freeze`` and ``cgroup.events`` stay open from the
    first use until :meth:`forget` (see :class:`~cosched.hostfs.OpenFile`):
    a slot change at 64 vCPUs per guest is 128 writes and at least 64 reads.
    """

    def __init__(self, fs: HostFS):
        self.fs = fs
        self.files: dict[str, tuple[OpenFile, OpenFile]] = {}

    def _files(self, freeze_file: str) -> tuple[OpenFile, OpenFile]:
        files = self.files.get(freeze_file)
        if files is None:
            files = self.files[freeze_file] = (self.fs.open_file(freeze_file, write=True),
                                               self.fs.open_file(events_file(freeze_file)))
        return files

    def set(self, freeze_file: str, frozen: bool) -> None:
        """Write ``cgroup.freeze``; OSError (ENOENT when the vCPU is gone) propagates."""
        self._files(freeze_file)[0].write("1" if frozen else "0")

    def is_frozen(self, freeze_file: str) -> bool:
        """What ``cgroup.events`` says now; OSError when the cgroup is gone."""
        return bool(events_frozen(self._files(freeze_file)[1].read()))

    def wait(self, freeze_files: list[str], frozen: bool, timeout: float = 0.05,
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
                    if self.is_frozen(path) != frozen:
                        still.append(path)
                except OSError:
                    pass                      # gone: nothing to wait for
            pending = still
            if not pending or time.monotonic() > deadline:
                break
        return pending

    @contextlib.contextmanager
    def still(self, freeze_file: str, timeout: float, on_thaw_error=None):
        """Keep a cgroup frozen while the body runs (waiting up to
        ``timeout`` for it to freeze first), then thaw it. A cgroup that
        cannot be frozen (gone) runs the body as it is; an OSError from the
        thaw goes to ``on_thaw_error`` (raised without one)."""
        try:
            self.set(freeze_file, True)
        except OSError:
            yield
            return
        try:
            self.wait([freeze_file], True, timeout)
            yield
        finally:
            try:
                self.set(freeze_file, False)
            except OSError as e:
                if on_thaw_error is None:
                    raise
                on_thaw_error(e)

    def forget(self, freeze_file: str) -> None:
        """Close this cgroup's files (its vCPU left the plan)."""
        for f in self.files.pop(freeze_file, ()):
            f.close()

    def close(self) -> None:
        for path in list(self.files):
            self.forget(path)


class FreezerKnob(FileKnob):
    """Record, restore and verify ``cgroup.freeze`` files: each vCPU's own."""

    kind = KIND

    def paths(self, target: Target) -> tuple[str, ...]:
        return (target.freeze,) if target.freeze else ()

    def verify(self, entry: dict) -> bool:
        if not super().verify(entry):
            return False
        # a thaw takes effect at once; a freeze only once the threads trap
        return entry["original"] == "1" or not events_frozen(self.fs.read_or(events_file(entry["path"])))
