"""Four 2-vCPU `lu` guests under one mode (argument: relaxed, cfs, ...): the
daemon's sampling period, samples and late samples, read from its status
once a second for ten seconds. Run as root from the repository, with
libvirtd running (`python -m testbed.services`):

    PYTHONPATH=. .venv/bin/python benchmarks/evidence/relaxed-skew-4-guests/sample_period.py relaxed
"""
import sys
import time

from benchmarks.suite import under_mode

mode = sys.argv[1]
with under_mode(["lu"] * 4, mode) as (daemon, gs):
    time.sleep(4)
    out = []
    for _ in range(10):
        dm = (daemon.status() or {}).get("daemon", {})
        out.append((round(dm.get("sample_period_ms", 0), 1), dm.get("samples"), dm.get("late_samples")))
        time.sleep(1)
print(mode, "(sample_period_ms, samples, late_samples) each second:", out)
