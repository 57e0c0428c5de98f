"""The ``cosched`` command's entry point: for the daemon, signals first.

A SIGTERM or SIGINT that arrives while the daemon starts (its imports take
seconds on a busy host) must end it in order, not with the signal's default
action half-way through: so before anything else is imported, the daemon's
signals only set :data:`STOP`, which the daemon then obeys
(:meth:`cosched.daemon.Daemon.run`), and a SIGHUP waits until it can reload.
"""
import signal
import sys
import threading

STOP = threading.Event()


def main() -> int:
    if sys.argv[1:2] == ["daemon"]:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: STOP.set())
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    from cosched.cli import main as command
    return command(stop=STOP)
