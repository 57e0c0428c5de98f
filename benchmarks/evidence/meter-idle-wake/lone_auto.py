"""One guest alone under ``auto`` (a daemon with its defaults: the meter on):
the mode, signals, scores and reason ``cosched explain`` gives, every 2 s
for 20 s, per workload.

    python benchmarks/evidence/meter-idle-wake/lone_auto.py [WORKLOAD ...] > lone-auto.json
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from testbed import guests, image                      # noqa: E402
from testbed.daemon import DaemonProcess              # noqa: E402


def main() -> None:
    img = image.build()
    daemon = DaemonProcess(Path(tempfile.mkdtemp(prefix="cosched-lone-")), extra_config="").start()
    out = {}
    try:
        for wl in sys.argv[1:] or ["pingpong", "barrier", "blocking"]:
            g = guests.start(f"cosched-lone-{wl}", image=img, workload=wl, policy=guests.annotation("auto"))
            rows = []
            try:
                g.wait_for("cosched-result")
                for _ in range(10):
                    time.sleep(2.0)
                    e = daemon.explain(g.name)
                    rows.append({k: e.get(k) for k in ("mode", "chosen", "signals", "scores", "reason")})
            finally:
                g.destroy()
            out[wl] = rows
    finally:
        daemon.stop()
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
