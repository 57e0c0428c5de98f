"""SIGHUP re-reads the presets while the daemon keeps running (its own daemon: the
module-scoped one of test_observe must not manage the same guests)."""
from __future__ import annotations

import signal

from testbed import guests
from testbed.daemon import DaemonProcess


def test_sighup_reloads_presets(start_guest, tmp_path, libvirtd):
    site = tmp_path / "policies.d"
    site.mkdir()
    d = DaemonProcess(tmp_path, presets_dirs=(str(site),)).start()
    try:
        g = start_guest("sighup", workload="idle", policy=guests.annotation("fast"))
        d.wait(lambda: (x := d.domain(g.name)) and x["error"] and "unknown preset 'fast'" in x["error"], 5,
               "unknown preset reported")
        (site / "fast.toml").write_text('policy = "gang"\n[parameters]\nquantum-ms = 10\n')
        d.proc.send_signal(signal.SIGHUP)
        dom, _ = d.wait(lambda: (x := d.domain(g.name)) and x["policy"] == "fast" and x, 2, "preset after SIGHUP")
        assert dom["params"]["quantum-ms"] == 10 and dom["error"] is None
        assert d.proc.poll() is None
    finally:
        assert d.stop() == 0
