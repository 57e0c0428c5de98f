"""Which thread runs which vCPU, as QEMU itself says: QMP ``query-cpus-fast``.

For QEMU processes found in /proc with a QMP server socket on their command
line (Proxmox VE's ``/var/run/qemu-server/VMID.qmp``), discovery asks QEMU
each vCPU's ``cpu-index`` and ``thread-id``. This does not depend on thread
names (``debug-threads=on``), and is the third witness next to names and
cgroups (:mod:`cosched.discovery.threads`).

A QMP server socket serves one client at a time, and the guest's own
manager (Proxmox's ``qm``, ``qmeventd``) needs it too: cosched connects for
one query, with a short timeout, and disconnects, and only when it has no
answer for this process yet or the process's threads changed (vCPU
hot-plug). A busy or absent socket is no error: the names and cgroups still
tell. The exchange is QMP's own (one JSON object per line: the greeting,
``qmp_capabilities``, the query; events in between are skipped), spoken
with the standard library: a client library would be a dependency that
Debian does not carry, for three lines of protocol.
"""
from __future__ import annotations

import json
import logging
import socket
import time

log = logging.getLogger("cosched.discovery")

TIMEOUT_S = 1.0
MAX_REPLY = 1 << 20          # bytes: a reply longer than this is no answer


class QmpError(Exception):
    """QEMU's answer was an error, or not QMP."""


def _replies(sock: socket.socket, deadline: float):
    """The JSON objects QEMU sends, one per line, until ``deadline``."""
    buf = b""
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)
        left = deadline - time.monotonic()
        if left <= 0 or len(buf) > MAX_REPLY:
            raise TimeoutError("no complete reply in time")
        sock.settimeout(left)
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("QEMU closed the socket")
        buf += chunk


def _execute(sock: socket.socket, replies, command: str):
    sock.sendall(json.dumps({"execute": command}).encode() + b"\n")
    for reply in replies:
        if "return" in reply:
            return reply["return"]
        if "error" in reply:
            error = reply["error"]
            raise QmpError(f"{command}: {error.get('desc', error) if isinstance(error, dict) else error}")
        # an event ({"event": ...}): not ours


def _query(path: str, timeout: float) -> dict[int, int]:
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        replies = _replies(sock, deadline)
        if "QMP" not in next(replies):
            raise QmpError("no QMP greeting")
        _execute(sock, replies, "qmp_capabilities")
        cpus = _execute(sock, replies, "query-cpus-fast")
    return {int(c["cpu-index"]): int(c["thread-id"]) for c in cpus}


def vcpu_threads(path: str, timeout: float = TIMEOUT_S) -> dict[int, int] | None:
    """``{vCPU index: thread id}`` from the QMP socket at ``path``; None when QEMU cannot say now."""
    try:
        return _query(path, timeout)
    except (OSError, QmpError, StopIteration, KeyError, TypeError, ValueError) as e:
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
