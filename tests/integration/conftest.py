"""Integration fixtures: a real libvirtd, real guests, a real daemon.

Everything is session-scoped where it can be: guests take seconds to boot,
so tests share them. All test guests are named ``cosched-it-*`` and are
destroyed at the start and the end of the session.
"""
from __future__ import annotations

import os

import pytest

from testbed import guests, image, services
from testbed.daemon import DaemonProcess  # noqa: F401  (tests import it from here)

PREFIX = "cosched-it-"
LEFTOVERS = ("cosched-bench-", "cosched-demo-")     # the project's other test guests (benchmarks, make demo)


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
    for leftover in LEFTOVERS:      # busy guests of an interrupted benchmark or demo would skew every test
        guests.destroy_all(leftover)
    yield
    guests.destroy_all(PREFIX)


@pytest.fixture(scope="session")
def guest_image():
    return image.build()


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
