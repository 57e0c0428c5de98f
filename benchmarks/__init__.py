"""The benchmark harness: the full suite, scale, soak, and their reports."""
import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path


def commit() -> str | None:
    """The short hash of the checkout's HEAD the harness runs from, with ``+`` appended
    when tracked files differ from it (None outside a git checkout)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode:
        return None
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], capture_output=True).returncode
    return head.stdout.strip() + ("+" if dirty else "")


def output_options(ap: argparse.ArgumentParser) -> None:
    """The options every tool here shares: ``--out DIR`` and ``--report DIR``."""
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--report", type=Path, default=None, help="redraw DIR/summary.md from DIR/results.json")


def redrawn(args, summary) -> bool:
    """With ``--report DIR``, DIR/summary.md drawn again from DIR/results.json by ``summary`` (True)."""
    if not args.report:
        return False
    (args.report / "summary.md").write_text(summary(json.loads((args.report / "results.json").read_text())))
    return True


def as_root(ap: argparse.ArgumentParser, why: str) -> None:
    """Refuse to run but as root (``why``: what it does), and exit cleanly on SIGTERM."""
    if os.geteuid() != 0:
        ap.error(f"run as root: {why}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def written(out: Path, res: dict, summary) -> None:
    """``res`` kept as OUT/results.json and drawn into OUT/summary.md, which is printed."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1))
    text = summary(res)
    (out / "summary.md").write_text(text)
    print("\n" + text + f"\nwritten to {out}/")
