"""Synthetic guests watched by a daemon started, as systemd starts services,
with a soft limit of 1,024 open files: how many vCPUs it samples, how many
its switcher watches.

    cd CHECKOUT && python benchmarks/evidence/open-files-limit/probe.py OUT.json

From the checkout it runs (the daemon is that checkout's ``python -m
cosched``). Two parts, each with its own daemon: ``observe``, 64 guests of
8 vCPUs under ``none`` (the daemon's sampler keeps two or three
descriptors per vCPU), and ``boost``, 32 guests of 8 vCPUs under
``boost`` (the switcher keeps five per vCPU it watches, more while it
boosts). A vCPU is sampled when /metrics has its run-time series; watched
when the switcher holds a descriptor of its ``schedstat``. Also counted:
the daemon's log lines naming "Too many open files", its switchers
started, its tracebacks; and whether the daemon answered its status
socket within 60 s of its start (else it is killed and so recorded).
"""
from __future__ import annotations

import json
import os
import re
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.getcwd())

from testbed import synthetic  # noqa: E402
from testbed.daemon import DaemonProcess  # noqa: E402

SOFT = 1024
SLEEP_MS = 50


def switcher_pid(daemon: DaemonProcess) -> int | None:
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if Path(f"/proc/{pid}/stat").read_text().split()[3] == str(daemon.proc.pid):
                    if b"cosched.engine.switcher" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        return int(pid)
            except (OSError, IndexError):
                pass
    return None


def links(pid: int) -> list[str]:
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    return out


def part(name: str, guests: int, per_guest: int, tag: str, work: Path) -> dict:
    pve = work / f"pve-{name}"
    gs = []
    try:
        for n in range(guests):
            gs.append(synthetic.start(f"fdl-{name}-{n}", vcpus=per_guest, workload="sleep", sleep_ms=SLEEP_MS,
                                      vmid=20000 + n, pve_dir=str(pve), tags=tag, workdir=work))
        vcpus = sum(g.vcpus for g in gs)
        (work / f"daemon-{name}").mkdir()
        daemon = DaemonProcess(work / f"daemon-{name}",
                               extra_config=f'sources = ["processes"]\npve_config_dir = "{pve}"\n')
        try:
            daemon.start(timeout=60)
        except TimeoutError:                   # killed by start(), with its switcher
            log = daemon.log.read_text()
            return {"part": name, "guests": guests, "vcpus": vcpus, "answered": False,
                    "too_many_open_files_lines": log.count("Too many open files"),
                    "log": [line for line in log.splitlines() if "Too many" in line][:5]}
        try:
            deadline, found = time.monotonic() + 120, None
            while time.monotonic() < deadline and found != vcpus:
                s = daemon.status()
                found = sum(len(d["vcpus"]) for d in s["domains"]) if s else found
                time.sleep(1)
            time.sleep(30)                     # resyncs (every 5 s) retry what failed; the switcher has its plan
            try:
                metrics = daemon.metrics()
            except OSError:                    # no answer
                metrics = None
            sampled = len(re.findall(r"^cosched_vcpu_run_seconds_total\{", metrics, re.M)) if metrics else None
            status = daemon.status() or {"daemon": {"engine": {}}}
            sw = switcher_pid(daemon)
            held = links(sw) if sw else []
            watched = {m.group(1) for m in (re.match(r"/proc/(\d+)/schedstat$", p) for p in held) if m}
            log = daemon.log.read_text()
            return {"part": name, "guests": guests, "vcpus": vcpus, "answered": True, "found": found, "sampled": sampled,
                    "watched": len(watched), "daemon_fds": len(links(daemon.proc.pid)),
                    "switcher_fds": len(held),
                    "switcher_fds_from_1024": sum(1 for fd in os.listdir(f"/proc/{sw}/fd") if int(fd) >= 1024) if sw else None,
                    "limits": re.search(r"Max open files.*", Path(f"/proc/{daemon.proc.pid}/limits").read_text()).group(0),
                    "errors": status["daemon"]["engine"].get("errors", [])[:5],
                    "too_many_open_files_lines": log.count("Too many open files"),
                    "switchers_started": log.count("action=switcher-started"), "tracebacks": log.count("Traceback"),
                    "log": [line for line in log.splitlines() if "open-files" in line or "unsampled" in line
                            or "Too many" in line][:5]}
        finally:
            daemon.stop()
    finally:
        synthetic.destroy_all(gs)


def main() -> int:
    out = Path(sys.argv[1])
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (SOFT, hard))     # inherited by the daemon, as from systemd
    with tempfile.TemporaryDirectory(prefix="cosched-fdl-") as tmp:
        res = [part("observe", 64, 8, "cosched-none", Path(tmp)), part("boost", 32, 8, "cosched-boost", Path(tmp))]
    out.write_text(json.dumps(res, indent=1) + "\n")
    for r in res:
        print(json.dumps({k: v for k, v in r.items() if k not in ("errors", "log")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
