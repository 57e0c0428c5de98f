"""Every kernel test starts and ends with the kernel's deadline admission total right.

These tests boost and return real threads as the switcher does, without
the daemon that recounts the total after its last return
(:func:`cosched.actuators.admission.recount_after_release`). Returns the
kernel miscounts leave the total wrong for the whole host, and every later
deadline request (the next test's, the next run's) is refused with EBUSY.
So each test is checked before and after, and the total recounted when it
is wrong, as the daemon would; a recount is reported as a warning.
"""
import time
import warnings

import pytest

from cosched.actuators.admission import RELEASE_WAIT_MAX_NS, Admission
from cosched.hostfs import HostFS


def _repair(admission: Admission, when: str) -> None:
    if admission.wrong():
        problem = admission.repair()
        assert problem is None, f"{when}: {problem}"
        warnings.warn(f"{when}: the kernel's deadline admission total was wrong (past its cap); recounted")


@pytest.fixture(autouse=True)
def admission_total(request):
    admission = Admission(HostFS("/"))
    try:
        _repair(admission, f"before {request.node.name}")
        yield
        time.sleep(RELEASE_WAIT_MAX_NS / 1e9)          # bandwidth still to be let go of
        _repair(admission, f"after {request.node.name}")
    finally:
        admission.close()
