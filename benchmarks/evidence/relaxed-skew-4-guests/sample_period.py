"""Four 2-vCPU `lu` guests under one mode (argument: relaxed, cfs, ...): the
daemon's sampling period, samples and late samples, read from its status
once a second for ten seconds. Run as root from the repository, with
libvirtd running (`python -m testbed.services`):

    PYTHONPATH=. .venv/bin/python benchmarks/evidence/relaxed-skew-4-guests/sample_period.py relaxed
"""
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.suite import boot_set, set_policy
from testbed.daemon import DaemonProcess
from testbed.image import build

mode = sys.argv[1]
gs = boot_set(["lu"] * 4, 2, build())
try:
    with tempfile.TemporaryDirectory() as tmp:
        d = DaemonProcess(Path(tmp)).start()
        try:
            for g in gs:
                set_policy(g.name, mode, {})
            time.sleep(4)
            out = []
            for _ in range(10):
                dm = (d.status() or {}).get("daemon", {})
                out.append((round(dm.get("sample_period_ms", 0), 1), dm.get("samples"), dm.get("late_samples")))
                time.sleep(1)
            print(mode, "(sample_period_ms, samples, late_samples) each second:", out)
        finally:
            d.stop()
finally:
    for g in gs:
        g.destroy()
