"""Integration fixtures: a real libvirtd, real guests, a real daemon.

Everything is session-scoped where it can be: guests take seconds to boot,
so tests share them. All test guests are named ``cosched-it-*`` and are
destroyed at the start and the end of the session.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed import guests, image, services

PREFIX = "cosched-it-"


def pytest_collection_modifyitems(items):
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def libvirtd():
    """libvirtd and virtlogd running, no test guests left from earlier runs."""
    if os.geteuid() != 0:
        pytest.fail("integration tests need root (run `make test` as root)")
    services.ensure()
    guests.destroy_all(PREFIX)
    yield
    guests.destroy_all(PREFIX)


@pytest.fixture(scope="session")
def guest_image():
    return image.build()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DaemonProcess:
    """``cosched daemon`` as a subprocess with its own state dir and port."""

    def __init__(self, tmp: Path, extra_config: str = ""):
        self.tmp = tmp
        self.port = free_port()
        self.config = tmp / "cosched.toml"
        self.config.write_text(f'state_dir = "{tmp}/state"\npresets_dirs = []\n{extra_config}')
        self.log = tmp / "daemon.log"
        self.proc: subprocess.Popen | None = None

    def start(self, *args: str) -> "DaemonProcess":
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cosched", "daemon", "--config", str(self.config),
             "--metrics-address", f"127.0.0.1:{self.port}", *args],
            stdout=subprocess.DEVNULL, stderr=open(self.log, "w"), start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.status() is not None:
                return self
            assert self.proc.poll() is None, f"daemon exited:\n{self.log.read_text()}"
            time.sleep(0.1)
        raise TimeoutError(f"daemon did not answer:\n{self.log.read_text()}")

    def status(self) -> dict | None:
        from cosched.control import request
        try:
            return request(f"{self.tmp}/state/cosched.sock", timeout=3)
        except (OSError, ValueError):
            return None

    def domain(self, name: str) -> dict | None:
        s = self.status() or {"domains": []}
        return next((d for d in s["domains"] if d["name"] == name), None)

    def metrics(self) -> str:
        import urllib.request
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            return r.read().decode()

    def wait(self, predicate, timeout: float, what: str):
        """Poll ``predicate()`` until truthy; return (value, seconds taken)."""
        start = time.monotonic()
        while True:
            value = predicate()
            if value:
                return value, time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise AssertionError(f"{what}: not within {timeout}s\n--- daemon log ---\n{self.log.read_text()[-3000:]}")
            time.sleep(0.05)

    def stop(self) -> int:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                raise
        return self.proc.returncode if self.proc else 0


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, libvirtd):
    d = DaemonProcess(tmp_path_factory.mktemp("daemon")).start()
    yield d
    assert d.stop() == 0, d.log.read_text()


@pytest.fixture
def start_guest(libvirtd, guest_image):
    """Boot guests for one test and destroy them afterwards."""
    started = []

    def start(suffix: str, **kw) -> guests.Guest:
        g = guests.start(PREFIX + suffix, image=guest_image, **kw)
        started.append(g)
        return g

    yield start
    for g in started:
        g.destroy()
