"""The state journal and the knobs that restore its entries, on fake trees."""
import os
import threading

import pytest
from fakehost import FakeSched

from cosched.actuators import journal as jr
from cosched.actuators.freezer import FreezerKnob
from cosched.actuators.pinning import PinKnob
from cosched.actuators.rt_runtime import RtRuntimeKnob
from cosched.actuators.sched import SchedAttr, SchedKnob, get_attr, set_attr, zero_bandwidth
from cosched.hostfs import HostFS


class FakePinner:
    def __init__(self):
        self.maps = {}

    def current(self, uuid):
        if uuid == "stopped":
            raise jr.Gone(uuid)
        return [self.maps.get((uuid, i), (True, True)) for i in range(2)]

    def pin(self, uuid, vcpu, cpumap):
        if uuid == "stopped":
            raise jr.Gone(uuid)
        self.maps[(uuid, vcpu)] = tuple(cpumap)


def knobs(fs, sched=None, pinner=None):
    return {k.kind: k for k in (SchedKnob(fs, get=(sched or FakeSched()).get, put=(sched or FakeSched()).set),
                                FreezerKnob(fs), RtRuntimeKnob(fs), PinKnob(pinner))}


def threads(fake, *tids):
    for tid in tids:
        fake.stat(1, tid, "CPU 0/TCG")           # start time 1000 + tid


def test_restore_order_identity_and_idempotence(fake, fs, tmp_path):
    for p in ("/cg/a/cpu.rt_runtime_us", "/cg/a/v0/cpu.rt_runtime_us", "/cg/a/v0/cgroup.freeze"):
        fake.write(p, "5")
    threads(fake, 7, 8)
    sched, pinner = FakeSched(), FakePinner()
    batch = SchedAttr("batch", nice=3)
    sched.attrs = {7: batch, 8: batch}
    k = knobs(fs, sched, pinner)
    j = jr.Journal(str(tmp_path / "run/journal"))
    j.record(dict([k["rt"].record("/cg/a/cpu.rt_runtime_us"), k["rt"].record("/cg/a/v0/cpu.rt_runtime_us"),
                   k["freeze"].record("/cg/a/v0/cgroup.freeze"), k["sched"].record(7, 1007),
                   ("sched:8:999", {"kind": "sched", "tid": 8, "start_time": 999, "attr": batch.to_json()}),
                   *k["pin"].record("u", "vm").items()]))
    j.record({"rt:/cg/a/cpu.rt_runtime_us": {"kind": "rt", "path": "/cg/a/cpu.rt_runtime_us", "original": "999"}})
    assert jr.Journal(j.path).entries["rt:/cg/a/cpu.rt_runtime_us"]["original"] == "5"     # first recording wins
    # the daemon changed all of it
    for p in ("/cg/a/cpu.rt_runtime_us", "/cg/a/v0/cpu.rt_runtime_us", "/cg/a/v0/cgroup.freeze"):
        fs.write(p, "1" if p.endswith("freeze") else "0")
    sched.attrs = {7: SchedAttr("fifo", priority=2), 8: SchedAttr("fifo", priority=2)}
    pinner.maps = {("u", 0): (True, False)}
    order = []
    fs_write = fs.write
    fs.write = lambda p, d: (order.append(p), fs_write(p, d))
    assert jr.restore(jr.Journal(j.path), k) == []
    assert sched.attrs == {7: batch, 8: SchedAttr("fifo", priority=2)}       # tid 8 is another thread now
    assert order == ["/cg/a/v0/cgroup.freeze", "/cg/a/v0/cpu.rt_runtime_us", "/cg/a/cpu.rt_runtime_us"]
    assert pinner.maps[("u", 0)] == (True, True)
    assert len(jr.Journal(j.path)) == 0
    assert all(fs.read(p) == "5" for p in order)
    assert jr.restore(jr.Journal(j.path), k) == []                            # idempotent


def test_what_could_not_be_restored_stays_and_is_named(fake, fs, tmp_path):
    threads(fake, 5)
    j = jr.Journal(str(tmp_path / "journal"))
    j.record({"pin:u:0": {"kind": "pin", "uuid": "u", "name": "vm", "vcpu": 0, "cpumap": [True]},
              "odd:1": {"kind": "odd"},
              "sched:5:1005": {"kind": "sched", "tid": 5, "start_time": 1005, "attr": {"policy": "nonsense"}}})
    problems = jr.restore(j, knobs(fs, pinner=None))
    assert any("pin:u:0" in p and "unreachable" in p for p in problems)
    assert any("odd:1" in p and "no knob" in p for p in problems)
    assert any("sched:5:1005" in p and "unknown scheduling policy 'nonsense'" in p for p in problems)
    assert len(jr.Journal(j.path)) == 3


def test_a_lookup_error_is_a_problem_not_a_vanished_domain(fs, tmp_path):
    j = jr.Journal(str(tmp_path / "journal"))
    j.record({"pin:u:0": {"kind": "pin", "uuid": "u", "vcpu": 0}})          # no cpumap: KeyError
    problems = jr.restore(j, knobs(fs, pinner=FakePinner()))
    assert problems == ["pin:u:0: KeyError: 'cpumap'"]
    assert len(jr.Journal(j.path)) == 1


def test_a_stopped_domain_is_gone(fs, tmp_path):
    j = jr.Journal(str(tmp_path / "journal"))
    j.record({"pin:stopped:0": {"kind": "pin", "uuid": "stopped", "name": "vm", "vcpu": 0, "cpumap": [True]}})
    assert jr.restore(j, knobs(fs, pinner=FakePinner())) == [] and len(j) == 0


def entries(n):
    return {f"freeze:/cg/{i}/cgroup.freeze": {"kind": "freeze", "path": f"/cg/{i}/cgroup.freeze", "original": "0"}
            for i in range(n)}


def test_damaged_lines_lose_only_themselves(tmp_path, caplog):
    path = tmp_path / "journal"
    jr.Journal(str(path)).record(entries(4))
    lines = path.read_text().split("\n")
    assert lines[0] == jr.HEADER and lines[5].startswith("end 4 ")
    lines[2] = lines[2].replace('"original":"0"', '"original":"1"')      # a flipped byte
    path.write_text("\n".join(lines))
    j = jr.Journal(str(path))
    assert len(j) == 3 and "freeze:/cg/1/cgroup.freeze" not in j.entries
    assert any("line 3: checksum mismatch" in d for d in j.damage)
    assert (tmp_path / "journal.damaged").read_text() == "\n".join(lines)
    assert "action=damaged" in caplog.text and "action=recovered entries=3" in caplog.text


def test_a_cut_short_journal_says_so(tmp_path):
    path = tmp_path / "journal"
    jr.Journal(str(path)).record(entries(3))
    text = path.read_text()
    path.write_text(text[: text.index("\nend ") - 10])                     # cut inside the last entry
    j = jr.Journal(str(path))
    assert len(j) == 2
    assert any("line 4" in d for d in j.damage) and any("cut short" in d for d in j.damage)


def test_garbage_recovers_nothing_loudly(tmp_path):
    path = tmp_path / "journal"
    path.write_bytes(b"\x00\xffgarbage\n")
    j = jr.Journal(str(path))
    assert len(j) == 0 and j.damage


def test_version_1_journal_is_read(tmp_path):
    path = tmp_path / "journal.json"
    path.write_text('{"version": 1, "entries": {'
                    '"file:/cg/a/cgroup.freeze": {"kind": "file", "path": "/cg/a/cgroup.freeze", "original": "0", "depth": 3},'
                    '"file:/cg/a/cpu.rt_runtime_us": {"kind": "file", "path": "/cg/a/cpu.rt_runtime_us", "original": "0", "depth": 3},'
                    '"sched:7:1": {"kind": "sched", "tid": 7, "start_time": 1, "policy": "other", "priority": 0}}}')
    j = jr.Journal(str(path))
    assert not j.damage
    assert sorted(e["kind"] for e in j.entries.values()) == ["freeze", "rt", "sched"]
    assert SchedAttr.from_json(j.entries["sched:7:1"]["attr"]) == SchedAttr("other")


def test_sched_attr_names_every_policy_and_refuses_unknown_ones():
    for policy in ("other", "batch", "idle", "fifo", "rr", "deadline"):
        assert SchedAttr.from_json(SchedAttr(policy).to_json()) == SchedAttr(policy)
    with pytest.raises(ValueError, match="unknown scheduling policy"):
        SchedAttr("turbo")


def test_real_sched_attr_round_trip_on_a_thread_of_this_test():
    """get_attr/set_attr against the kernel, on a thread this test started (its own)."""
    tid, stop = [], threading.Event()
    t = threading.Thread(target=lambda: (tid.append(threading.get_native_id()), stop.wait(10)))
    t.start()
    try:
        while not tid:
            pass
        original = get_attr(tid[0])
        assert original.policy == "other"
        knob = SchedKnob(HostFS("/"))       # set_attr, and a deadline thread leaves through zero bandwidth
        for want in (SchedAttr("batch", nice=7), SchedAttr("idle"),
                     SchedAttr("deadline", runtime_ns=1_000_000, deadline_ns=10_000_000, period_ns=10_000_000)):
            try:
                knob.apply(tid[0], want)
            except PermissionError:
                assert want.policy == "deadline"     # admission control may refuse; nothing changed then
                continue
            assert get_attr(tid[0]) == want
        knob.apply(tid[0], original)
        assert get_attr(tid[0]) == original
    finally:
        stop.set()
        t.join()


DL = SchedAttr("deadline", runtime_ns=4_000_000, deadline_ns=400_000_000, period_ns=400_000_000)


def test_a_thread_leaves_deadline_through_zero_bandwidth(fake, fs):
    """The kernel keeps the bandwidth of a deadline thread that leaves while
    asleep: every way out of SCHED_DEADLINE passes through a reservation of 0."""
    fake.write("/proc/sys/kernel/sched_deadline_period_max_us", "1000000\n")
    zero = SchedAttr("deadline", runtime_ns=1024, deadline_ns=1_000_000_000, period_ns=1_000_000_000)
    assert zero_bandwidth(fs) == zero
    sched = FakeSched()
    knob = sched.knob(fs)
    knob.apply(7, DL)
    knob.apply(7, SchedAttr("other"))
    knob.apply(8, SchedAttr("fifo", priority=1))           # never a deadline thread: one write
    knob.apply(8, SchedAttr("other"))
    knob.apply(9, DL)
    knob.apply(9, SchedAttr("deadline", runtime_ns=1_000_000, deadline_ns=10_000_000, period_ns=10_000_000))
    assert sched.calls == [(7, DL), (7, zero), (7, SchedAttr("other")),
                           (8, SchedAttr("fifo", priority=1)), (8, SchedAttr("other")), (9, DL), sched.calls[-1]]
    # restoring a journal entry asks the thread itself (the daemon that boosted it may have died)
    threads(fake, 10)
    sched.attrs[10], sched.calls[:] = DL, []
    entry = SchedKnob(fs, get=sched.get, put=sched.set).record(10, 1010)[1]
    entry["attr"] = SchedAttr("other", nice=3).to_json()
    SchedKnob(fs, get=sched.get, put=sched.set).restore(entry)
    assert sched.calls == [(10, zero), (10, SchedAttr("other", nice=3))]


def test_zero_bandwidth_without_the_sysctl_is_one_second(fs):
    assert zero_bandwidth(fs).period_ns == 1_000_000_000


def test_returning_a_sleeping_deadline_thread_leaves_no_bandwidth_behind(tmp_path):
    """On the kernel, with a thread of this test that computes 0.1 ms and
    sleeps 2 ms, boosted as ``boost`` boosts (4 ms per 400 ms) and returned
    half a millisecond later, mostly while it sleeps: the root domain's
    deadline total (debugfs, mounted privately) is what it was."""
    import re
    import subprocess
    import time
    mnt = tmp_path / "debugfs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "debugfs", "none", str(mnt)], check=True)
    try:
        def total_bw() -> int:
            found = re.findall(r"dl_bw->total_bw\s+:\s+(-?\d+)", (mnt / "sched" / "debug").read_text())
            assert found, "no dl_bw->total_bw in debugfs sched/debug"
            return int(found[0])

        tid, stop = [], threading.Event()

        def work():
            tid.append(threading.get_native_id())
            while not stop.is_set():
                t = time.perf_counter()
                while time.perf_counter() - t < 0.0001:
                    pass
                time.sleep(0.002)
        t = threading.Thread(target=work)
        t.start()
        try:
            while not tid:
                time.sleep(0.001)
            knob, before, asleep = SchedKnob(HostFS("/")), total_bw(), 0
            original = get_attr(tid[0])
            for _ in range(50):
                knob.apply(tid[0], DL)
                time.sleep(0.0005)
                asleep += open(f"/proc/self/task/{tid[0]}/stat").read().rsplit(")", 1)[1].split()[0] == "S"
                knob.apply(tid[0], original)
                time.sleep(0.001)
            assert asleep >= 20, f"only {asleep} of 50 returns found the thread asleep: not the case under test"
            time.sleep(0.5)                   # past every zero-lag time (4 ms runtime at 1%: 0.4 s)
            assert total_bw() == before
        finally:
            stop.set()
            t.join()
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


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


def test_a_write_that_does_not_take_is_reported_and_kept(fake, fs, tmp_path):
    fake.write("/cg/a/cpu.rt_runtime_us", "0")
    j = jr.Journal(str(tmp_path / "journal"))
    k = knobs(fs)
    j.record(dict([k["rt"].record("/cg/a/cpu.rt_runtime_us")]))
    fs.write("/cg/a/cpu.rt_runtime_us", "5000")
    real = fs.write
    fs.write = lambda p, d: None                      # the kernel accepts the write and ignores it
    problems = jr.restore(j, k)
    assert problems == ["rt:/cg/a/cpu.rt_runtime_us (original=0): written, but the host does not hold the original value"]
    assert len(jr.Journal(j.path)) == 1
    fs.write = real
    assert jr.restore(j, k) == [] and fs.read("/cg/a/cpu.rt_runtime_us") == "0"
