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


def test_a_thread_returned_when_its_deadline_may_be_past_is_kept_from_deadline_for_the_zero_period(fake, fs):
    """The zero reservation can give a thread whose deadline has passed a new
    one its whole period away, which its next boost would inherit: the knob
    says until when (a return within the boost's deadline, none)."""
    fake.write("/proc/sys/kernel/sched_deadline_period_max_us", "1000000\n")
    now = [0]
    sched = FakeSched()
    knob = sched.knob(fs, clock=lambda: now[0])
    boost = SchedAttr("deadline", runtime_ns=1_000_000, deadline_ns=10_000_000, period_ns=10_000_000)
    knob.apply(7, boost)
    now[0] = 9_000_000
    knob.apply(7, SchedAttr("other"))                      # within its deadline
    assert knob.quiet_until(7) == 0
    knob.apply(7, boost)
    now[0] += 10_000_000
    knob.apply(7, SchedAttr("other"))                      # at its deadline: held up
    assert knob.quiet_until(7) == now[0] + 1_000_000_000
    # a restore does not know when the boost began: always kept
    threads(fake, 10)
    sched.attrs[10] = boost
    entry = knob.record(10, 1010)[1]
    entry["attr"] = SchedAttr("other").to_json()
    now[0] += 2_000_000_000                                # 7's time is over, and forgotten
    knob.restore(entry)
    assert (knob.quiet_until(10), knob.quiet_until(7), knob._quiet.keys()) == (now[0] + 1_000_000_000, 0, {10})
    knob.apply(8, SchedAttr("other"))                      # never a deadline thread
    assert knob.quiet_until(8) == 0


def test_each_boost_holds_what_admission_allows_per_cpu_up_to_half(fake, fs):
    from cosched.engine.switcher import MAX_SHARE, boost_share
    assert boost_share(fs) == MAX_SHARE                                # 95% by default, less the fair server
    fake.write("/proc/sys/kernel/sched_rt_runtime_us", "300000\n")
    fake.write("/proc/sys/kernel/sched_rt_period_us", "1000000\n")
    assert boost_share(fs) == pytest.approx(0.9 * 0.25)
    fake.write("/proc/sys/kernel/sched_rt_runtime_us", "-1\n")           # no limit
    assert boost_share(fs) == MAX_SHARE


def test_zero_bandwidth_without_the_sysctl_is_one_second(fs):
    assert zero_bandwidth(fs).period_ns == 1_000_000_000


def test_returning_a_deadline_thread_leaves_no_bandwidth_behind(tmp_path):
    """On the kernel, with a thread of this test that computes (0.1-1 ms) and
    sleeps (0.5-2 ms) by turns, boosted as ``boost`` boosts and returned up to
    2 ms later, 100 times, while it sleeps, runs or waits: the root
    domain's deadline total (debugfs, mounted privately) is what it was.
    (A thread that left SCHED_DEADLINE directly, found runnable just before,
    sometimes fell asleep in between and left its bandwidth counted: one in
    a thousand returns, until every boost on the host was refused; this
    test caught it once in a full run.)"""
    import random
    from cosched.engine.switcher import boost_attr, boost_share
    boost = boost_attr(2, boost_share(HostFS("/")))
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
                while time.perf_counter() - t < random.uniform(0.0001, 0.001):
                    pass
                time.sleep(random.uniform(0.0005, 0.002))
        t = threading.Thread(target=work)
        t.start()
        try:
            while not tid:
                time.sleep(0.001)
            knob, before, asleep = SchedKnob(HostFS("/")), total_bw(), 0
            original = get_attr(tid[0])
            for _ in range(100):
                knob.apply(tid[0], boost)
                time.sleep(random.uniform(0, 0.002))
                asleep += open(f"/proc/self/task/{tid[0]}/stat").read().rsplit(")", 1)[1].split()[0] == "S"
                knob.apply(tid[0], original)
                time.sleep(boost.period_ns / 1e9)          # a fresh boost each time, as boost does
            assert 10 <= asleep <= 90, f"{asleep} of 100 returns found the thread asleep: not the cases under test"
            time.sleep(0.5)                   # past every zero-lag time
            assert total_bw() == before
        finally:
            stop.set()
            t.join()
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


BOOSTED_SELF = """
import json, os, sys, threading, time
from cosched.actuators.sched import SchedKnob, get_attr
from cosched.engine.switcher import boost_attr, fresh_ns
from cosched.hostfs import HostFS
share = float(sys.argv[1])
knob, me = SchedKnob(HostFS("/")), os.getpid()
def rescue():          # a thread left throttled may never run again, nor die: set it free, then exit
    time.sleep(20)
    os.sched_setscheduler(me, os.SCHED_OTHER, os.sched_param(0))
    os._exit(3)
threading.Thread(target=rescue, daemon=True).start()
original, walls = get_attr(me), []
for _ in range(40):
    t0, c0 = time.monotonic_ns(), time.thread_time_ns()
    knob.apply(me, boost_attr(2, share))
    t1 = time.monotonic_ns()
    while time.thread_time_ns() - c0 < 1_000_000:       # 1 ms of CPU, boosted
        pass
    walls.append((time.monotonic_ns() - t0) / 1e6)
    knob.apply(me, original)                            # returned while it runs, as most boosts end
    time.sleep(max(t1 + fresh_ns(2, share) - time.monotonic_ns(), 0) / 1e9)   # a fresh boost, as boost waits
print(json.dumps(walls))
"""


def test_a_vcpu_boosted_again_and_again_runs_in_every_boost():
    """The kernel hands a thread that re-enters SCHED_DEADLINE before its
    last deadline the budget it left with: boosts that came sooner than a
    period after the last one began started with a spent budget, and from
    the second or third boost on the thread was throttled (not run at all)
    until the deadline, which a budget run out under the zero reservation
    had moved seconds away. A process of the test's own boosts itself as
    ``boost`` does, forty times, next to two spinning processes on this
    host's CPUs: each boost's 1 ms of CPU time takes about 1 ms."""
    import json
    import subprocess
    import sys
    from cosched.engine.switcher import boost_share
    share = boost_share(HostFS("/"))
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        out = subprocess.run([sys.executable, "-c", BOOSTED_SELF, str(share)], capture_output=True, text=True,
                             timeout=60)
    finally:
        for p in spin:
            p.kill()
            p.wait()
    assert out.returncode == 0, out.stderr or "stuck in its boosts for 20 s: set free and ended by its own thread"
    walls = sorted(json.loads(out.stdout))
    assert len(walls) == 40
    # a throttled boost waits out the rest of its period, or seconds
    assert walls[len(walls) // 2] < 2.0 and walls[-1] < 50, walls


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
