"""RT runtime grants (``cpu.rt_runtime_us``) on kernels with RT group scheduling.

With ``CONFIG_RT_GROUP_SCHED`` (the v1 ``cpu`` controller has
``cpu.rt_runtime_us``) a thread may only run SCHED_FIFO/SCHED_RR if every
cgroup on its cpu path holds RT runtime; ``Host.rt_chain`` lists those files,
top-down (machine, domain, vcpuN). These files sit outside libvirt's
delegation at the top of the chain: cosched journals each original before its
first write and restores it on exit. Most distribution kernels lack the option
and need no grants.

The kernel refuses a parent holding less than its children, so grants shrink
deepest first and grow top first. A cgroup removed while it holds RT runtime
is not freed (kernel 6.18: ``/proc/cgroups`` keeps counting it) and its
runtime keeps counting against its parent: later grants there are refused
(EINVAL) and the parent cannot be restored below it, until the kernel frees
the group (measured: not within half an hour, gone within an hour). So a
guest's grants must go back before libvirt removes its cgroups (the
switcher watches its vCPUs exit); a grant found gone on release is
reported. Grants are static while a guest is managed:
revoking runtime between slots leaves the throttle's debt, and vCPUs then
fail to freeze for 50 ms and more (measured on the development hosts).
"""
from __future__ import annotations

import os
from typing import Callable

from cosched.actuators.journal import GONE, FileKnob, Target
from cosched.hostfs import HostFS

KIND = "rt"


def read_runtime(fs: HostFS, path: str) -> int:
    return int(fs.read(path).strip())


def depth(path: str) -> int:
    return path.count("/")


class RtGrants:
    """The grants one process holds, each file's original kept until it is released.

    ``grant`` makes the held set exactly ``wanted`` (files missing from it go
    back to their originals); ``release_all`` puts every original back.
    Errors never raise: ``on_error(message)`` hears of each, and ``grant``
    returns the files it could not grant (the boosts that needed them must
    not be attempted).
    """

    def __init__(self, fs: HostFS, on_error: Callable[[str], None]):
        self.fs = fs
        self.on_error = on_error
        self.originals: dict[str, str] = {}
        self.held: dict[str, int] = {}
        self.stranded_us = 0             # runtime held by removed cgroups against a parent still there

    def _write(self, path: str, value: int | str) -> None:
        """Write and check: a grant the file does not hold afterwards is an error."""
        if path not in self.originals:
            self.originals[path] = self.fs.read(path).strip()
        self.fs.write(path, str(value))
        self.held[path] = int(value)
        held = self.fs.read(path).strip()
        if held != str(value):
            raise OSError(0, f"wrote {value}, the file holds {held}")

    def grant(self, wanted: dict[str, int]) -> set[str]:
        """Hold exactly ``wanted``; return the paths whose grant failed."""
        self.release([p for p in self.originals if p not in wanted])
        current = {p: int(self.fs.read_or(p, "0") or 0) for p in wanted}
        failed: set[str] = set()
        for p in sorted((p for p in wanted if wanted[p] < current[p]), key=lambda p: -depth(p)):
            try:
                self._write(p, wanted[p])
            except OSError as e:
                if e.errno not in GONE:
                    self.on_error(f"rt runtime {p}: {_reason(e)}")
        for p in sorted(wanted, key=depth):
            if wanted[p] > current.get(p, 0):
                try:
                    self._write(p, wanted[p])
                except OSError as e:
                    if e.errno not in GONE:
                        failed.add(p)
                        self.on_error(f"RT runtime grant {p}={wanted[p]} failed: {_reason(e)}")
        return failed

    def release(self, paths) -> None:
        """Put these files back to their originals, deepest first."""
        for p in sorted({p for p in paths if p in self.originals}, key=lambda p: -depth(p)):
            held = self.held.pop(p, 0)
            try:
                self.fs.write(p, self.originals.pop(p))
            except OSError as e:
                if e.errno not in GONE:
                    self.on_error(f"rt runtime restore {p}: {_reason(e)}")
                elif held > 0:
                    group = os.path.dirname(p)
                    if self.fs.exists(os.path.dirname(group)):    # what a removed parent held counts for it
                        self.stranded_us += held
                    self.on_error(f"cgroup {group} was removed holding {held} us of RT runtime: the kernel "
                                  f"counts it against {os.path.dirname(group)} until it frees the group, and "
                                  f"grants there may be refused until then")

    def release_all(self) -> None:
        self.release(list(self.originals))


def _reason(e: OSError) -> str:
    return os.strerror(e.errno) if e.errno else str(e.strerror)


class RtRuntimeKnob(FileKnob):
    """Record, restore and verify ``cpu.rt_runtime_us`` files: those on each
    vCPU's cpu cgroup path (restored deepest first)."""

    kind = KIND

    def paths(self, target: Target) -> tuple[str, ...]:
        return target.rt_chain
