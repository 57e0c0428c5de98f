"""systemd's service notification protocol, spoken directly (no library needed).

Under ``Type=notify`` systemd passes ``$NOTIFY_SOCKET``: a datagram socket,
given as a path or, with a leading ``@``, a name in the abstract namespace.
Each message is one datagram of ``KEY=VALUE`` lines. cosched sends:

``READY=1``       once the first discovery has completed and the status
                  socket answers (systemd then starts units ordered after it);
``STATUS=...``    a one-line summary whenever it changes (``systemctl status``);
``WATCHDOG=1``    every half of ``$WATCHDOG_USEC`` (``WatchdogSec=``) while the
                  daemon is healthy; a hung daemon stops pinging and systemd
                  restarts it, ``ExecStopPost=cosched reset`` cleaning up;
``RELOADING=1``   on SIGHUP, then ``READY=1`` when the reload is done;
``STOPPING=1``    when shutting down.

Without ``$NOTIFY_SOCKET`` (run from a shell) every call does nothing.
"""
from __future__ import annotations

import logging
import os
import socket
import time

log = logging.getLogger("cosched.notify")


class Notifier:
    def __init__(self, environ: dict | None = None):
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        self.address = "\0" + address[1:] if address.startswith("@") else address
        usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
        mine = not pid or (pid.isdigit() and int(pid) == os.getpid())
        self.watchdog_interval = int(usec) / 2e6 if usec.isdigit() and int(usec) > 0 and mine else None
        self._last_watchdog = 0.0
        self._status = None
        if environ is None:     # the switcher and other children must not talk to systemd
            for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
                os.environ.pop(key, None)

    def send(self, *lines: str) -> bool:
        """Send one message; False (and a log line) when it could not be sent."""
        if not self.address:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.sendto("\n".join(lines).encode(), self.address)
            return True
        except OSError as e:
            log.warning("action=notify-failed socket=%r error=%r", self.address.replace("\0", "@"), e.strerror)
            return False

    def ready(self, status: str) -> None:
        self._status = status
        self.send("READY=1", f"STATUS={status}")

    def status(self, status: str) -> None:
        """Send ``STATUS=`` when it differs from the last one sent."""
        if status != self._status:
            self._status = status
            self.send(f"STATUS={status}")

    def reloading(self) -> None:
        self.send("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")

    def stopping(self) -> None:
        self.send("STOPPING=1")

    def watchdog(self, now: float | None = None) -> bool:
        """Ping the watchdog if half its interval has passed; True when sent."""
        if self.watchdog_interval is None:
            return False
        now = time.monotonic() if now is None else now
        if now - self._last_watchdog < self.watchdog_interval:
            return False
        self._last_watchdog = now
        return self.send("WATCHDOG=1")
