"""Figures of the fault suite, for ``make soak``'s table.

A test calls :func:`record` with what it did and found, before it asserts,
so that a failing run still reports its leaks. At the end of the session
(``pytest_sessionfinish`` in ``conftest.py``) the figures are merged into
the JSON file named by ``COSCHED_SOAK_OUT``, if set; ``python -m
benchmarks.soak`` turns that file into the table.

Figures per part (any may be left out where it does not apply):
``cycles`` (rounds run), ``faults`` (faults injected), ``leaks`` (anything
found left behind: journal entries, cgroups, frozen or boosted threads,
pinning), ``exits`` (daemon exits nobody asked for), ``notes`` (text).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

FIGURES: dict[str, dict] = {}


def record(part: str, **figures) -> None:
    """Add these figures to ``part`` (numbers add up over calls; text is kept last)."""
    mine = FIGURES.setdefault(part, {"test_file": os.environ.get("COSCHED_SOAK_PART", "")})
    for k, v in figures.items():
        mine[k] = mine.get(k, 0) + v if isinstance(v, (int, float)) and not isinstance(v, bool) else v


def write() -> None:
    out = os.environ.get("COSCHED_SOAK_OUT")
    if not out or not FIGURES:
        return
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    merged = json.loads(path.read_text()) if path.exists() else {}
    merged.update(FIGURES)
    path.write_text(json.dumps(merged, indent=1, sort_keys=True))
