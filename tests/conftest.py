import os
from pathlib import Path

import pytest

from tests.support.fakehost import CgroupEventsFS, FakeHost
from tests.support.guard.guard_rules import install

GUARD = Path(__file__).resolve().parent / "support" / "guard"


# The scheduling guard (tests/support/guard): in this process, and in every Python
# process a test starts (daemons, switchers, the CLI) through sitecustomize.
os.environ.setdefault("COSCHED_TEST_SESSION_PID", str(os.getpid()))   # the parent of the synthetic guests
GUARD_LOG = Path(os.environ.setdefault("COSCHED_TEST_GUARD_LOG", f"/tmp/cosched-test-guard-{os.getpid()}.log"))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(GUARD), os.environ.get("PYTHONPATH")]))
install()


@pytest.fixture(autouse=True)
def scheduling_guard():
    """Fail the test if anything it ran tried to change the scheduling of a
    thread that is not a test guest's vCPU (or its own)."""
    before = GUARD_LOG.stat().st_size if GUARD_LOG.exists() else 0
    yield
    if GUARD_LOG.exists() and GUARD_LOG.stat().st_size > before:
        with open(GUARD_LOG) as f:
            f.seek(before)
            pytest.fail("scheduling guard: a real host thread was targeted:\n" + f.read())


@pytest.fixture
def fake(tmp_path):
    return FakeHost(tmp_path)


@pytest.fixture
def fs(fake):
    """The fake host, read and written as the daemon does; ``cgroup.events``
    follows ``cgroup.freeze`` as the kernel's does."""
    return CgroupEventsFS(fake.root)


def pytest_sessionfinish(session, exitstatus):
    """The fault suite's figures, for ``make soak`` (see ``tests/support/soak.py``)."""
    from tests.support import soak
    soak.write()
