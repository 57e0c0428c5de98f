"""Start virtlogd and libvirtd when they are not running (hosts without systemd).

On a systemd host the packaged units do this; here the testbed does it
itself. ``python3 -m testbed.services`` starts both and waits until libvirtd
answers on qemu:///system.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

SOCKETS = {
    "virtlogd": "/run/libvirt/virtlogd-sock",
    "libvirtd": "/run/libvirt/libvirt-sock",
}


def running(name: str) -> bool:
    return subprocess.run(["pgrep", "-x", name], capture_output=True).returncode == 0


def libvirtd_answers(uri: str = "qemu:///system") -> bool:
    return subprocess.run(["virsh", "-c", uri, "version"], capture_output=True).returncode == 0


def start(name: str) -> None:
    subprocess.run([f"/usr/sbin/{name}", "-d"], check=True)


def stop(name: str, timeout: float = 30.0) -> None:
    """Kill ``name`` (SIGTERM) and wait until it has exited."""
    subprocess.run(["pkill", "-x", name], check=True)
    deadline = time.monotonic() + timeout
    while running(name):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not exit within {timeout}s")
        time.sleep(0.1)


def ensure(timeout: float = 30.0) -> None:
    """Start whatever is missing and wait for libvirtd to answer."""
    for name in ("virtlogd", "libvirtd"):
        if not running(name):
            start(name)
    deadline = time.monotonic() + timeout
    while not libvirtd_answers():
        if time.monotonic() > deadline:
            raise RuntimeError("libvirtd did not answer on qemu:///system")
        time.sleep(0.2)


if __name__ == "__main__":
    if os.geteuid() != 0:
        sys.exit("testbed.services: run as root")
    ensure()
    print("virtlogd and libvirtd are running")
