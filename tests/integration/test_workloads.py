"""Every guest workload boots and reports progress on the serial console."""
from __future__ import annotations

import time

import pytest

from testbed import guests

from .conftest import PREFIX

WORKLOADS = ["barrier", "deadline", "spinlock", "lu", "ep", "blocking", "pingpong"]


@pytest.mark.parametrize("workload", WORKLOADS)
def test_workload_reports_progress(workload, libvirtd, guest_image):
    g = guests.start(PREFIX + "wl-" + workload, workload=workload, image=guest_image)
    try:
        g.wait_for(f"cosched-ready workload={workload}")
        g.wait_for("cosched-result", timeout=30)
        first = g.results()[-1]
        deadline = time.monotonic() + 30
        while len(g.results()) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        last = g.results()[-1]
        console = g.console()
    finally:
        g.destroy()
    assert last["iters"] > first["iters"] > 0, (first, last)
    # self-checks: every worker pinned to its own vCPU, lu's residual within bounds
    assert last["errors"] == 0 and "cosched-error" not in console, console[-2000:]
    assert last["t_ms"] > first["t_ms"]
    if workload == "deadline":
        assert 0 <= last["missed"] <= last["iters"]
