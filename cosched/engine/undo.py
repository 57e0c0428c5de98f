"""Undo: put back what the journal recorded, and leave the kernel's deadline admission total right.

The one way cosched gives the host back, whoever asks: the engine when a
switcher dies, when it stops managing and when it starts after a daemon that
did not exit cleanly; ``cosched reset`` without a running daemon. Each knob
restores its own entries (:func:`cosched.actuators.journal.restore`, in the
journal's order); then, once the boosts' bandwidth is released, the deadline
admission total is checked and recounted if wrong
(:func:`cosched.actuators.admission.recount_after_release`): boosts returned while pinning
went back can leave it wrong for every program on the host.
"""
from __future__ import annotations

import logging
import os

from cosched.actuators import journal as jr
from cosched.actuators import knobs
from cosched.actuators.admission import recount_after_release
from cosched.hostfs import HostFS

log = logging.getLogger("cosched.engine")


def restore(journal: jr.Journal, every: dict, kinds=jr.ORDER) -> list[str]:
    """Put back every entry of these kinds; the problems, each logged."""
    problems = jr.restore(journal, every, kinds)
    for problem in problems:
        log.error("action=restore-failed %s", problem)
    return problems


def recount_admission(fs: HostFS, sched, released_by: int = 0) -> list[str]:
    """The deadline admission total checked (and recounted if wrong) once the
    bandwidth of boosts released by ``released_by`` (monotonic ns) is free."""
    problem = recount_after_release(fs, sched, released_by)
    return [problem] if problem else []


def undo(journal: jr.Journal, every: dict, fs: HostFS, kinds=jr.ORDER, released_by: int = 0) -> list[str]:
    """Restore these kinds, then have the admission total recounted where wrong; the problems."""
    return restore(journal, every, kinds) + recount_admission(fs, every["sched"], released_by)


def reset(journal_path: str, fs: HostFS) -> list[str]:
    """``cosched reset`` without a daemon: everything on the journal at
    ``journal_path`` undone; a damaged line is a problem (its original may
    be lost)."""
    if not os.path.exists(journal_path):
        return []
    journal = jr.Journal(journal_path)
    problems = [f"journal damaged, an original may be lost: {d}" for d in journal.damage]
    return problems + undo(journal, knobs(fs), fs)
