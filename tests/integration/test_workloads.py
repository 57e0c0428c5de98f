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


def test_live_counters_are_read_from_guest_memory_at_any_instant(libvirtd, guest_image):
    g = guests.start(PREFIX + "wl-live", workload="barrier interval_ms=100", image=guest_image)
    try:
        g.wait_for("cosched-result", timeout=30)
        a = g.counters()
        time.sleep(0.5)
        b = g.counters()
        line = g.results()[-1]
        g.dom.suspend()                              # no vCPU runs: the counters stand still
        try:
            time.sleep(0.2)
            c = g.counters()
            time.sleep(0.5)
            d = g.counters()
        finally:
            g.dom.resume()
        deadline = time.monotonic() + 10
        while g.results()[-1]["iters"] <= d["iters"] and time.monotonic() < deadline:
            time.sleep(0.1)
        after = g.results()[-1]
    finally:
        g.destroy()
    assert a is not None and 0 < a["iters"] < b["iters"], (a, b)
    assert line["iters"] <= c["iters"]               # the memory is never behind the console
    assert c == d and c["errors"] == 0
    assert after["iters"] > d["iters"]               # and the guest goes on from where it stood


def test_real_software_runs_again_and_again_and_reports_progress(libvirtd):
    """Every program of the suite's real-software guests runs under the
    ``exec`` workload, each in a guest booted from the software image: a
    run counts only if each program of it exits 0."""
    from benchmarks.suite import SOFTWARE
    from testbed import image
    img = image.build_software()
    gs = [guests.start(PREFIX + f"wl-sw-{i}", workload=SOFTWARE[name].replace("exec ", "exec data_kib=64 ", 1),
                       image=img, memory_mib=256) for i, name in enumerate(SOFTWARE)]
    try:
        for g in gs:
            g.wait_for("cosched-ready workload=exec", timeout=120)
        deadline = time.monotonic() + 60
        while any(not g.results() or g.results()[-1]["iters"] < 2 for g in gs) and time.monotonic() < deadline:
            time.sleep(0.2)
        last = {name: (g.results() or [{}])[-1] for name, g in zip(SOFTWARE, gs)}
        consoles = {name: g.console() for name, g in zip(SOFTWARE, gs)}
    finally:
        for g in gs:
            g.destroy()
    for name in SOFTWARE:
        assert last[name].get("iters", 0) >= 2 and last[name]["errors"] == 0, (name, consoles[name][-1500:])
        assert "cosched-error" not in consoles[name], (name, consoles[name][-1500:])
