"""Probe (not part of the suite): overlaps seen by a sampler under the host scheduler and under SCHED_FIFO."""
import json, time
from tests.integration.test_proxmox import pve, frozen, NAMES  # noqa: F401
from .conftest import DaemonProcess, sampling


def passes(gs, n):
    overlaps = singles = 0
    prev = False
    longest = 0.0
    for _ in range(n):
        t0 = time.monotonic()
        now = tuple(frozen(g, 0) + frozen(g, 1) for g in gs)
        longest = max(longest, time.monotonic() - t0)
        both = all("0" in s for s in now)
        singles += both
        overlaps += both and prev
        prev = both
        time.sleep(0.002)
    return {"overlaps": overlaps, "single_passes_both": singles, "longest_pass_ms": round(1000 * longest, 3)}


def test_probe(pve, tmp_path):
    gs, conf = pve
    daemon = DaemonProcess(tmp_path, extra_config=f'sources = ["processes"]\npve_config_dir = "{conf}"\n').start()
    out = []
    try:
        daemon.wait(lambda: daemon.status()["daemon"]["engine"]["switches"].get("gang", 0) > 20, 20, "a gang of two")
        for r in range(12):
            cfs = passes(gs, 300)
            with sampling():
                fifo = passes(gs, 300)
            out.append({"round": r, "cfs": cfs, "fifo": fifo})
            print(out[-1], flush=True)
        errors = daemon.status()["daemon"]["engine"]["errors"]
    finally:
        assert daemon.stop() == 0
    json.dump({"rounds": out, "switcher_errors": errors}, open("/tmp/exp/probe_pve.json", "w"), indent=1)
