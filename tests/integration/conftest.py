"""Integration fixtures: a real libvirtd, real guests, a real daemon.

Everything is session-scoped where it can be: guests take seconds to boot,
so tests share them. All test guests are named ``cosched-it-*`` and are
destroyed at the start and the end of the session.
"""
from __future__ import annotations

import contextlib
import glob
import os

import pytest

from testbed import guests, image, services
from testbed.daemon import DaemonProcess  # noqa: F401  (tests import it from here)

PREFIX = "cosched-it-"
SAMPLER_PRIORITY = 40          # SCHED_FIFO: above a gang slot's boost (1), below the switcher (50)
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


def rt_grants() -> dict[str, str]:
    """The RT runtime of the top of the v1 ``cpu`` tree (RT group scheduling
    kernels): the root, ``machine`` (every guest's grants pass through it)
    and their siblings."""
    files = glob.glob("/sys/fs/cgroup/cpu/cpu.rt_runtime_us") + glob.glob("/sys/fs/cgroup/cpu/*/cpu.rt_runtime_us")
    out = {}
    for f in files:
        try:
            out[f] = open(f).read().strip()
        except OSError:
            pass
    return out


@pytest.fixture(scope="session", autouse=True)
def rt_grants_given_back():
    """After every integration test, the top RT grants are as the session
    found them (a group created meanwhile holds the kernel's 0 again): a grant
    a daemon kept would outlive it, and the next daemon would take it for
    the original."""
    before = rt_grants()
    yield
    after = rt_grants()
    kept = {f: (before.get(f, "0"), v) for f, v in after.items() if v != before.get(f, "0")}
    assert not kept, f"RT runtime left changed (file: (before, after)): {kept}"


@pytest.fixture(scope="session")
def guest_image():
    return image.build()


@pytest.fixture(scope="module")
def daemon(request, tmp_path_factory, libvirtd):
    """One daemon per test module; the module's ``DAEMON_CONFIG`` (if any) adds to its config."""
    extra = getattr(request.module, "DAEMON_CONFIG", "")
    d = DaemonProcess(tmp_path_factory.mktemp("daemon"), extra_config=extra).start()
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


@contextlib.contextmanager
def sampling():
    """Run the calling thread under SCHED_FIFO while it samples guests'
    freeze states: above the vCPUs' boosts, below the switcher. Under the
    host scheduler, beside busy pinned vCPUs, a sampling pass can be held
    off the CPU for longer than a slot (and a boosted gang keeps it off
    for the whole slot), so that one pass reads guests' files on both
    sides of slot changes and sees two guests running that never ran at
    once, or misses the slots it is to check."""
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(SAMPLER_PRIORITY))
    try:
        yield
    finally:
        os.sched_setscheduler(0, policy, param)
