"""One guest alone on the host under each of MODES in turn, REPS times, with
the benchmark suite's own steps (``apply_mode``, ``measure``: live counters
over 5 s): what a guest that needs nothing gets under the modes ``auto``
chose for it.

    python benchmarks/evidence/meter-idle-wake/lone_modes.py WORKLOAD MODES REPS > out.json
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks import suite                           # noqa: E402
from testbed import guests, image                      # noqa: E402
from testbed.daemon import DaemonProcess              # noqa: E402


def main() -> None:
    workload, modes, reps = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
    img = image.build()
    daemon = DaemonProcess(Path(tempfile.mkdtemp(prefix="cosched-lone-")), extra_config="").start()
    out = []
    try:
        gs = suite.boot_set([workload], 2, img)
        daemon.wait(lambda: daemon.domain(gs[0].name), 10, "guest observed")
        for rep in range(reps):
            for mode in suite.in_turn(modes, rep):
                notes = suite.apply_mode(daemon, gs, mode, 1.5)
                r = suite.measure(daemon, gs, mode, 5.0, False)
                g = r["per_guest"][gs[0].name]
                out.append({"mode": mode, "rep": rep, "valid": r["valid"], "rate": g["rate"], "notes": notes,
                            "modes": r.get("modes"), "daemon_cpu_pct": r.get("daemon_cpu_pct")})
                print(mode, rep, r["valid"], round(g["rate"]), notes, file=sys.stderr, flush=True)
    finally:
        guests.destroy_all(suite.PREFIX)
        daemon.stop()
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
