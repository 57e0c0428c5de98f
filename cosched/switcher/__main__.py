"""The switcher process: raise itself to SCHED_FIFO, take the meter's long-wait
reports where it can, and run the loop on stdin and stdout until the daemon
stops it or goes."""
from __future__ import annotations

import logging
import os
import signal
import sys

from cosched import logs
from cosched.hostfs import HostFS
from cosched.sampler.meter import LongWaits, MeterUnavailable
from cosched.switcher.loop import serve
from cosched.switcher.switcher import Switcher

log = logging.getLogger("cosched.switcher")


def main() -> int:
    """Entry point of the switcher process (``python -m cosched.switcher``)."""
    logs.setup(logging.INFO)
    priority = int(os.environ.get("COSCHED_SWITCHER_PRIORITY", "50"))
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
        realtime = True
    except OSError as e:
        realtime = False
        log.warning("action=no-realtime error=%r: boosts disabled, switching may be late", os.strerror(e.errno))
    try:
        long_waits = LongWaits.from_env(os.environ)
    except MeterUnavailable as e:
        long_waits = None
        log.warning("action=long-waits-off error=%r: long waits are found by looks", str(e))
    sw = Switcher(HostFS(os.environ.get("COSCHED_HOST_ROOT", "/")), max_stall_ns=500_000_000, long_waits=long_waits)
    stopping: list = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.append(1))

    def write(line: str) -> None:
        sys.stdout.write(line)
        sys.stdout.flush()

    serve(sw, sys.stdin.fileno(), write, realtime, stopping)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
