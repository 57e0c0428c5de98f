"""Four 2-vCPU `blocking` guests under `auto` for 90 s: every mode change the
daemon logs, and how many. Run as root from the repository, with libvirtd
running (`python -m testbed.services`); from another checkout's directory,
with PYTHONPATH pointing at it, to measure that checkout's code:

    PYTHONPATH=. .venv/bin/python benchmarks/evidence/auto-idleness/mode_changes.py [SECONDS]
"""
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.suite import boot_set, set_policy
from testbed.daemon import DaemonProcess
from testbed.image import build

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 90.0
gs = boot_set(["blocking"] * 4, 2, build())
try:
    with tempfile.TemporaryDirectory() as tmp:
        d = DaemonProcess(Path(tmp)).start()
        try:
            for g in gs:
                set_policy(g.name, "auto", {})
            time.sleep(seconds)
        finally:
            d.stop()
        changes = [line for line in d.log.read_text().splitlines() if "action=mode " in line]
    print("\n".join(changes))
    print(f"{len(changes)} mode changes in {seconds:g} s for {len(gs)} guests")
finally:
    for g in gs:
        g.destroy()
