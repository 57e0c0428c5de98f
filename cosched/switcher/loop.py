"""The switcher's I/O loop: plans in from the daemon, slots kept on time, counts out.

The protocol is :mod:`cosched.switcher.protocol`: one message a line. The loop
sleeps until the next slot boundary or look, a plan, a report of a long wait,
or the exit of a vCPU holding RT runtime. A report due shortly before a slot
boundary (within :data:`~cosched.switcher.timing.STATS_SLACK_NS`) is sent at
that boundary, so that a rotation costs one wake-up per slot change.
"""
from __future__ import annotations

import logging
import os
import select
import time
from dataclasses import replace
from typing import Callable

from cosched.switcher import protocol as pr
from cosched.switcher.switcher import Switcher
from cosched.switcher.timing import IDLE_STATS_EVERY_NS, STATS_EVERY_NS, STATS_SLACK_NS

log = logging.getLogger("cosched.switcher")


def serve(sw: Switcher, rfd: int, write: Callable[[str], None], realtime: bool,
          stopping: list | None = None) -> None:
    """The switch loop: read plans from ``rfd``, keep slots on time, report.

    ``write`` sends one encoded line to the daemon. Returns when ``rfd``
    closes (the daemon is gone), on ``Stop``, or once ``stopping`` is
    non-empty; everything is released before it returns.
    """
    stopping = stopping if stopping is not None else []
    reports = [sw.long_waits.fileno()] if sw.long_waits is not None else []
    write(pr.encode(pr.Ready(realtime)))
    buf = b""
    next_stats = time.monotonic_ns() + STATS_EVERY_NS
    deadline = None
    try:
        while not stopping:
            now = time.monotonic_ns()
            wake = deadline if deadline is not None and deadline <= next_stats + STATS_SLACK_NS else next_stats
            try:
                ready, _, _ = select.select([rfd, *sw.grants.exits, *reports], [], [], max(wake - now, 0) / 1e9)
            except InterruptedError:
                continue
            for fd in ready:
                if fd in reports:
                    sw.take_reports(time.monotonic_ns())
                elif fd != rfd:
                    sw.exited(fd)
            if rfd in ready:
                chunk = os.read(rfd, 1 << 20)
                if not chunk:
                    break                              # the daemon is gone
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    try:
                        msg = pr.decode(line)
                    except ValueError as e:
                        sw._error(str(e))
                        continue
                    if isinstance(msg, pr.Stop):
                        stopping.append(1)
                    elif isinstance(msg, pr.Orders):
                        if not realtime:               # boosts need the switcher above them
                            msg = _without_boosts(msg)
                        sw.apply(msg)
                        write(pr.encode(pr.Applied(msg.seq)))
                        next_stats = min(next_stats, time.monotonic_ns() + STATS_EVERY_NS)
            deadline = sw.tick()
            if time.monotonic_ns() >= next_stats:
                write(pr.encode(sw.take_stats()))
                next_stats += STATS_EVERY_NS if sw.busy else IDLE_STATS_EVERY_NS
    except BrokenPipeError:
        pass
    finally:
        sw.release_all()
        try:
            write(pr.encode(sw.take_stats(released=True)))
        except (BrokenPipeError, ValueError, OSError):
            pass
        log.info("action=released")


def _without_boosts(msg: pr.Orders) -> pr.Orders:
    """The plan with no boosts: a switcher that is not realtime cannot end them on time."""
    return replace(msg, cells=tuple(replace(c, members=tuple(replace(m, priority=0, boost_ms=0) for m in c.members))
                                    for c in msg.cells))
