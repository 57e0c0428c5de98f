"""RT runtime for boosted vCPUs (RT group scheduling kernels), and the exits that give it back.

Every boosted member's vCPU cgroups hold the RT runtime its boosts need (a
``boost`` guest's grant serves its SCHED_FIFO boosts; without one it boosts
with SCHED_DEADLINE only, which needs none). Each vCPU holding runtime has an
exit descriptor: once one exits, its guest's runtime is given back at once,
before libvirt removes the guest's cgroups (a removed group keeps its runtime
counted: :mod:`cosched.actuators.rt_runtime`). Measured on a destroyed guest:
given back 1.8 s before libvirt's event that it stopped.
"""
from __future__ import annotations

import os
from typing import Callable

from cosched.actuators.rt_runtime import RtGrants
from cosched.hostfs import FD_SETSIZE, HostFS
from cosched.switcher.boosts import rt_granted
from cosched.switcher.vcpus import Vcpus


class Grants:
    """The RT runtime granted (``rt``) and the exit descriptors of the vCPUs holding it (``exits``)."""

    def __init__(self, fs: HostFS, vcpus: Vcpus, error: Callable[[str], None]):
        self.fs, self.vcpus, self.error = fs, vcpus, error
        self.rt = RtGrants(fs, error)
        self.exits: dict[int, tuple] = {}            # exit descriptor -> key of a vCPU holding RT runtime
        self._stranded_reported = 0

    def hold(self, owners: list[tuple], top_us: int | None) -> list[tuple[object, str, str]]:
        """Grant what these boosting members need and nothing else;
        ``owners``: (who, member plan, cell id, keys), those whose boosts
        failed left out. Returns (who, cell id, path) of each grant refused."""
        owners = [o for o in owners if rt_granted(o[1]) and not o[0].boost_failed]
        self.watch_exits([k for o in owners for k in o[3]])
        wanted: dict[str, int] = {}
        owner: dict[str, tuple[object, str]] = {}
        for who, p, cid, keys in owners:
            if any(k in self.vcpus.gone for k in keys):
                continue
            for c in [v.rt_chain for v in p.vcpus if v.rt_chain]:
                wanted[c[0]] = max(wanted.get(c[0], 0), top_us or 0)
                for path in c[1:-1]:
                    wanted[path] = p.rt_vcpu_us * len(p.vcpus)
                wanted[c[-1]] = p.rt_vcpu_us
                for path in c:
                    owner[path] = (who, cid)
        return [(*owner[path], path) for path in sorted(self.rt.grant(wanted))]

    def watch_exits(self, keys: list) -> None:
        """Keep an exit descriptor for exactly these vCPUs (those holding RT runtime)."""
        keep = set(keys)
        gone = self.vcpus.gone
        for fd, k in list(self.exits.items()):
            if k not in keep:
                del self.exits[fd]
                os.close(fd)
        watching = set(self.exits.values())
        for k in keep - watching - gone:
            try:
                fd = self.fs.exit_fd(k[2])
            except ProcessLookupError:
                gone.add(k)
                continue
            if fd is not None and fd >= FD_SETSIZE:
                os.close(fd)
                self.error(f"domain={self.vcpus.info[k][0]} vcpu={k[1]}: too many open descriptors to watch its "
                           f"exit; its RT runtime goes back only when the daemon sees the guest gone")
            elif fd is not None:
                self.exits[fd] = k
        gone &= keep

    def exited(self, fd: int) -> tuple | None:
        """The vCPU whose exit descriptor ``fd`` became readable (now known
        gone), or None if it was no longer watched; the descriptor is closed."""
        key = self.exits.pop(fd, None)
        os.close(fd)
        if key is not None:
            self.vcpus.gone.add(key)
        return key

    def release_all(self) -> None:
        self.rt.release_all()
        self.watch_exits([])

    def stranded(self) -> int:
        """RT runtime stranded in removed cgroups since the last call."""
        n, self._stranded_reported = self.rt.stranded_us - self._stranded_reported, self.rt.stranded_us
        return n
