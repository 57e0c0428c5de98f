"""Deadline admission: the check (a request for no bandwidth) and the
recount (one cpuset write), on fake system calls and a fake cgroup tree."""
import errno
import os

import pytest

from cosched.actuators.admission import RECOUNT_DIR, Admission, recount_after_release
from cosched.actuators.sched import SchedAttr, zero_bandwidth
from cosched.hostfs import HostFS

CPUSET = "/sys/fs/cgroup/cpuset"


class Calls:
    """``set_attr`` on a fake: answers requests for deadline reservations
    with ``errno`` (or None: granted) in turn, and notes each call."""

    def __init__(self, *answers):
        self.answers, self.calls = list(answers), []

    def __call__(self, pid, attr):
        self.calls.append((pid, attr, _state(pid)))
        answer = self.answers.pop(0) if self.answers and attr.policy == "deadline" else None
        if answer is not None:
            raise OSError(answer, os.strerror(answer))


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


class CgroupFS(HostFS):
    """A cpuset hierarchy as cgroupfs behaves: a new directory has its
    control files, and removing it takes them along. Writes are noted."""

    def __init__(self, root):
        super().__init__(root)
        self.log = []

    def mkdir(self, host_path):
        super().mkdir(host_path)
        self.path(f"{host_path}/cpuset.cpus").write_text("\n")
        self.log.append(("mkdir", host_path))

    def write(self, host_path, data):
        super().write(host_path, data)
        self.log.append(("write", host_path, data))

    def rmdir(self, host_path):
        for f in self.path(host_path).iterdir():
            f.unlink()
        super().rmdir(host_path)
        self.log.append(("rmdir", host_path))


@pytest.fixture
def cgfs(tmp_path):
    (tmp_path / CPUSET.lstrip("/")).mkdir(parents=True)
    (tmp_path / f"{CPUSET.lstrip('/')}/cpuset.effective_cpus").write_text("0-3\n")
    return CgroupFS(tmp_path)


def test_a_total_past_the_cap_refuses_a_request_for_no_bandwidth_on_a_sleeping_child_of_its_own():
    fs = HostFS("/")
    for answer, wrong in ((errno.EBUSY, True), (None, False), (errno.EPERM, None)):
        put = Calls(answer)
        admission = Admission(fs, put=put, mount=None)
        assert admission.wrong() is wrong
        child = admission._child.pid
        assert put.calls[0][:2] == (child, SchedAttr())    # started with the ordinary policy
        pid, attr, state = put.calls[1]
        assert (pid, attr, state) == (child, zero_bandwidth(fs), "S")   # asleep: it never runs under it
        assert open(f"/proc/{child}/stat").read().split()[3] == str(os.getpid())
        # granted: given its policy back at once; refused: nothing more asked
        assert [a for _, a, _ in put.calls[2:]] == ([SchedAttr()] if answer is None else [])
        assert admission.wrong() is False and [c[0] for c in put.calls] == [child] * len(put.calls)   # kept
        admission.close()
        assert _state(child) is None                     # gone with its pipe


def test_a_recount_is_one_cpuset_write_of_every_cpu_then_none_then_the_directory_goes(cgfs):
    Admission(cgfs, put=Calls(), mount=CPUSET).recount()
    d = f"{CPUSET}/{RECOUNT_DIR}"
    assert cgfs.log == [("mkdir", d), ("write", f"{d}/cpuset.cpus", "0-3"), ("write", f"{d}/cpuset.cpus", "\n"),
                        ("rmdir", d)]
    assert not cgfs.exists(d)


def test_a_recount_directory_left_by_a_killed_process_goes_first(cgfs):
    d = f"{CPUSET}/{RECOUNT_DIR}"
    cgfs.mkdir(d)
    cgfs.write(f"{d}/cpuset.cpus", "0-3")
    cgfs.log.clear()
    Admission(cgfs, put=Calls(), mount=CPUSET).recount()
    assert cgfs.log[:2] == [("write", f"{d}/cpuset.cpus", "\n"), ("rmdir", d)]   # emptied first: no rebuild later
    assert cgfs.log[2] == ("mkdir", d) and not cgfs.exists(d)


def test_repair_recounts_only_a_wrong_total_and_names_what_is_still_wrong(cgfs):
    fine = Calls(None)
    assert Admission(cgfs, put=fine, mount=CPUSET).repair() is None and cgfs.log == []
    healed = Calls(errno.EBUSY, None)
    assert Admission(cgfs, put=healed, mount=CPUSET).repair() is None
    assert [e[0] for e in cgfs.log] == ["mkdir", "write", "write", "rmdir"]
    stuck = Admission(cgfs, put=Calls(errno.EBUSY, errno.EBUSY), mount=CPUSET).repair()
    assert "still wrong after a recount" in stuck
    v2 = Admission(cgfs, put=Calls(errno.EBUSY), mount=None).repair()
    assert "cannot be recounted" in v2 and "no v1 cpuset hierarchy" in v2


def test_the_recount_waits_for_the_released_bandwidth_then_repairs(cgfs, tmp_path):
    from tests.support.fakehost import FakeSched
    now = [1_000_000_000]
    knob = FakeSched().knob(cgfs, clock=lambda: now[0])
    knob._released = now[0] + 30_000_000
    slept = []
    assert recount_after_release(cgfs, knob, until=now[0] + 20_000_000, sleep=slept.append) is None
    knob._released = now[0] + 60_000_000_000          # bounded: a second at most
    recount_after_release(cgfs, knob, sleep=slept.append)
    assert slept == [pytest.approx(0.030), pytest.approx(1.0)]


def test_a_recount_takes_one_cpu_where_an_exclusive_cpuset_holds_the_others(cgfs):
    class Exclusive(CgroupFS):
        def write(self, host_path, data):
            if host_path.endswith(f"{RECOUNT_DIR}/cpuset.cpus") and data.strip() not in ("", "3"):
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))   # CPUs 0-2 held exclusively
            super().write(host_path, data)
    fs = Exclusive(cgfs.root)
    Admission(fs, put=Calls(), mount=CPUSET).recount()
    d = f"{CPUSET}/{RECOUNT_DIR}"
    assert fs.log == [("mkdir", d), ("write", f"{d}/cpuset.cpus", "3"), ("write", f"{d}/cpuset.cpus", "\n"),
                      ("rmdir", d)]
    class Nothing(CgroupFS):
        def write(self, host_path, data):
            if host_path.endswith(f"{RECOUNT_DIR}/cpuset.cpus") and data.strip():
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
            super().write(host_path, data)
    fs = Nothing(cgfs.root)
    with pytest.raises(OSError) as refused:
        Admission(fs, put=Calls(), mount=CPUSET).recount()
    assert refused.value.errno == errno.EINVAL and not fs.exists(d)
