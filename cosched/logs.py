"""Log set-up for every cosched process (daemon, switcher, ``reset``).

Lines go to stderr. Under systemd, stderr is usually connected to journald
(``$JOURNAL_STREAM`` names that stream as ``DEVICE:INODE``); each line then
starts with its syslog priority (``<3>`` error, ``<4>`` warning, ``<6>``
info, ``<7>`` debug), which journald strips and records, so that
``journalctl -p warning -u cosched`` works, and carries no timestamp, since
journald adds its own.

SIGUSR1 makes any of them write every thread's Python stack to the same
stderr (``kill -USR1 PID``, or ``systemctl kill -s USR1 cosched`` for the
daemon and its switcher): for a daemon that seems stuck, without stopping it.
"""
from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys

PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6, logging.DEBUG: 7}


def to_journal(environ=os.environ, stream=sys.stderr) -> bool:
    """True when ``stream`` is the journal stream systemd handed us."""
    device, _, inode = environ.get("JOURNAL_STREAM", "").partition(":")
    if not (device.isdigit() and inode.isdigit()):
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return st.st_dev == int(device) and st.st_ino == int(inode)


class JournalFormatter(logging.Formatter):
    def __init__(self):
        super().__init__("%(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        prio = PRIORITY.get(record.levelno, 6 if record.levelno < logging.WARNING else 3)
        return "\n".join(f"<{prio}>{line}" for line in super().format(record).splitlines())


def setup(level: int = logging.INFO, fmt: str = "%(asctime)s %(levelname)s %(name)s %(message)s") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JournalFormatter() if to_journal() else logging.Formatter(fmt))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    try:
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    except (OSError, ValueError):       # a stderr that is no file (captured, in a test): no stacks
        pass
