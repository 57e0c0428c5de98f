"""Which thread runs which vCPU, as QEMU itself says: QMP ``query-cpus-fast``.

For QEMU processes found in /proc with a QMP server socket on their command
line (Proxmox VE's ``/var/run/qemu-server/VMID.qmp``), discovery asks QEMU
through the QEMU project's own client library (``qemu.qmp``): each vCPU's
``cpu-index`` and ``thread-id``. This does not depend on thread names
(``debug-threads=on``), and is the third witness next to names and cgroups
(:mod:`cosched.discovery.threads`).

A QMP server socket serves one client at a time, and the guest's own
manager (Proxmox's ``qm``, ``qmeventd``) needs it too: cosched connects for
one query, with a short timeout, and disconnects, and only when it has no
answer for this process yet or the process's threads changed (vCPU
hot-plug). A busy or absent socket is no error: the names and cgroups still
tell.
"""
from __future__ import annotations

import asyncio
import logging
import time

from qemu.qmp import QMPClient, QMPError

log = logging.getLogger("cosched.discovery")

TIMEOUT_S = 1.0


async def _query(path: str, timeout: float) -> dict[int, int]:
    client = QMPClient("cosched")
    try:
        await asyncio.wait_for(client.connect(path), timeout)
        cpus = await asyncio.wait_for(client.execute("query-cpus-fast"), timeout)
    finally:
        await client.disconnect()
    return {int(c["cpu-index"]): int(c["thread-id"]) for c in cpus}


def vcpu_threads(path: str, timeout: float = TIMEOUT_S) -> dict[int, int] | None:
    """``{vCPU index: thread id}`` from the QMP socket at ``path``; None when QEMU cannot say now."""
    try:
        return asyncio.run(_query(path, timeout))
    except (OSError, QMPError, asyncio.TimeoutError, KeyError, TypeError, ValueError) as e:
        log.debug("qmp=%s action=query-failed error=%r", path, str(e) or type(e).__name__)
        return None


RETRY_S = 60.0


class QmpCache:
    """One answer per process, asked again only when its set of threads
    changes; a query that failed (socket busy or gone) is tried again after
    :data:`RETRY_S`, so that a resync never waits on the same dead socket twice running."""

    def __init__(self, query=vcpu_threads, clock=time.monotonic):
        self.query = query
        self.clock = clock
        self._answers: dict[int, tuple[frozenset, dict[int, int] | None, float]] = {}

    def get(self, pid: int, path: str, threads: frozenset) -> dict[int, int] | None:
        known = self._answers.get(pid)
        if known is not None and known[0] == threads and (
                known[1] is not None or self.clock() - known[2] < RETRY_S):
            return known[1]
        answer = self.query(path)
        self._answers[pid] = (threads, answer, self.clock())
        return answer

    def forget(self, alive: set[int]) -> None:
        for pid in [p for p in self._answers if p not in alive]:
            del self._answers[pid]
