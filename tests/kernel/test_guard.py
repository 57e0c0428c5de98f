"""The scheduling guard of the tests themselves: no test reaches a thread that is not its own."""
import os

import pytest

from cosched.actuators.sched import (SchedAttr, set_attr)


def test_the_guard_refuses_a_thread_that_is_not_a_test_guest(tmp_path, monkeypatch):
    log = tmp_path / "guard.log"
    monkeypatch.setenv("COSCHED_TEST_GUARD_LOG", str(log))
    with pytest.raises(PermissionError, match="test guard"):
        set_attr(1, SchedAttr("other"))                              # init: never ours
    with pytest.raises(PermissionError, match="test guard"):
        os.sched_setscheduler(2, os.SCHED_OTHER, os.sched_param(0))
    assert log.read_text().count("refused") == 2
    # and in every Python process the tests start
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "from cosched.actuators.sched import SchedAttr, set_attr\n"
                          "set_attr(1, SchedAttr('other'))"], capture_output=True, text=True)
    assert out.returncode != 0 and "test guard" in out.stderr
    assert log.read_text().count("refused") == 3
    # a thread that no longer exists: the kernel answers (ESRCH), nothing is reached
    gone = int(open("/proc/sys/kernel/pid_max").read()) - 1
    with pytest.raises(ProcessLookupError):
        os.sched_setscheduler(gone, os.SCHED_OTHER, os.sched_param(0))
    assert log.read_text().count("refused") == 3
