"""Which QEMU processes the ``processes`` source may manage.

cosched runs as root and pins, freezes and boosts the threads of the guests
it manages. A process is a guest only if the platform started it: a name
proves nothing (anyone can run a program called ``qemu-system-x86_64`` with
threads called ``CPU 0/KVM``). The ``processes`` source takes a process only
when

* its executable, as the process sees it, matches one of ``emulators``
  (globs; by default the distribution's ``qemu-system-*``, ``qemu-kvm`` and
  Proxmox VE's ``kvm``), and
* that file, the one the process runs, is a regular file owned by root that
  neither its group nor others may write (so no unprivileged user could have
  put it there or changed it), and
* the process runs as root or as one of ``emulator_users`` (``libvirt-qemu``,
  ``qemu``), real and effective user both.

Anything else is ignored: said once in the log with the reason, and counted
in ``cosched_ignored_processes{reason}``. The host libvirtd's guests come
from libvirt itself and are not checked here.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from fnmatch import fnmatchcase

EMULATORS = ("/usr/bin/qemu-system-*", "/usr/bin/qemu-kvm", "/usr/libexec/qemu-kvm", "/usr/bin/kvm")
EMULATOR_USERS = ("libvirt-qemu", "qemu")
REASONS = ("executable", "file", "user")


@dataclass(frozen=True)
class Trust:
    """What a guest's process must be (the module doc); ``owner``: who must own the executable."""

    emulators: tuple[str, ...] = EMULATORS
    users: frozenset[int] = frozenset({0})
    owner: int = 0


def user_ids(names: tuple[str, ...]) -> frozenset[int]:
    """root and the users of ``names`` this host has (others are left out)."""
    import pwd
    uids = {0}
    for name in names:
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            pass
    return frozenset(uids)


def process_uids(status: str) -> tuple[int, int] | None:
    """(real, effective) user of a process from its ``/proc/PID/status``."""
    for line in status.splitlines():
        if line.startswith("Uid:"):
            ids = line.split()[1:3]
            if len(ids) == 2 and all(i.isdigit() for i in ids):
                return int(ids[0]), int(ids[1])
    return None


def verdict(path: str, st: os.stat_result, uids: tuple[int, int] | None, trust: Trust) -> tuple[str, str] | None:
    """Why a process may not be managed, as (reason, message); None when it may."""
    if not any(fnmatchcase(path, g) for g in trust.emulators):
        return "executable", f"its executable {path} is none of the emulators ({', '.join(trust.emulators)})"
    if not stat.S_ISREG(st.st_mode) or st.st_uid != trust.owner or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "file", (f"its executable {path} is not a regular file owned by uid {trust.owner} that only its owner "
                        f"may write (uid {st.st_uid}, mode {stat.filemode(st.st_mode)})")
    if uids is None or not set(uids) <= trust.users:
        return "user", f"it runs as uid {uids[0] if uids else '?'}, not root or an emulator user"
    return None
