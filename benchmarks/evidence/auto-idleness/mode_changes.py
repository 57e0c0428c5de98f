"""Four 2-vCPU `blocking` guests under `auto` for 90 s: every mode change the
daemon logs, and how many. Run as root from the repository, with libvirtd
running (`python -m testbed.services`); from another checkout's directory,
with PYTHONPATH pointing at it, to measure that checkout's code:

    PYTHONPATH=. .venv/bin/python benchmarks/evidence/auto-idleness/mode_changes.py [SECONDS]
"""
import sys
import time

from benchmarks.suite import under_mode

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 90.0
with under_mode(["blocking"] * 4, "auto") as (daemon, gs):
    time.sleep(seconds)
    daemon.stop()
    changes = [line for line in daemon.log.read_text().splitlines() if "action=mode " in line]
print("\n".join(changes))
print(f"{len(changes)} mode changes in {seconds:g} s for {len(gs)} guests")
