"""A SIGTERM at any point of the daemon's start-up ends it in order, exit 0.

The daemon is started as the service starts it, and told to stop at several
moments of its start-up, counted from the moment it catches SIGTERM (the
first lines of :mod:`cosched.entry`): during its first imports, while it
builds its parts, and once it serves. Each time it exits 0, having restored
what it recovered or wrote (here: nothing but the control socket it removes).

Before that moment the interpreter itself is starting (tens of milliseconds,
more on a busy host), nothing of the host has been touched, and SIGTERM ends
the process by its default action, which systemd counts as a clean stop."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest


def catches_sigterm(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as status:
        caught = next(line.split()[1] for line in status if line.startswith("SigCgt:"))
    return bool(int(caught, 16) >> (signal.SIGTERM - 1) & 1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("after", [0.0, 0.2, 0.5, 3.0])
def test_sigterm_during_start_up_ends_the_daemon_cleanly(tmp_path, after):
    config = tmp_path / "cosched.toml"
    config.write_text(f'state_dir = "{tmp_path}/run"\nsources = ["processes"]\npve_config_dir = "{tmp_path}/pve"\n'
                      f'metrics_address = "127.0.0.1:{free_port()}"\npresets_dirs = []\nmeter = "off"\n')
    proc = subprocess.Popen([sys.executable, "-m", "cosched", "daemon", "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 30
    while not catches_sigterm(proc.pid):
        assert proc.poll() is None and time.monotonic() < deadline, "the daemon never caught SIGTERM"
        time.sleep(0.001)
    time.sleep(after)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out[-3000:]
    assert not (tmp_path / "run" / "cosched.sock").exists(), out[-3000:]
