"""The switch loop against fake cgroup trees and a fake scheduling knob."""
import errno

from fakehost import FakeSched

from cosched.actuators.sched import SchedAttr
from cosched.engine import protocol as pr
from cosched.engine.switcher import Switcher
from cosched.hostfs import HostFS

CG2 = "/sys/fs/cgroup/unified"
CPU = "/sys/fs/cgroup/cpu"
MS = 1_000_000


class FreezerFS(HostFS):
    """A fake cgroup tree whose cgroup.events follows cgroup.freeze, like the kernel's."""

    def __init__(self, root, stuck=()):
        super().__init__(root)
        self.stuck = set(stuck)          # cgroups that never report frozen
        self.writes = []

    def write(self, host_path, data):
        self.writes.append((host_path, data))
        super().write(host_path, data)
        if host_path.endswith("/cgroup.freeze"):
            cg = host_path.rsplit("/", 1)[0]
            frozen = data == "1" and cg not in self.stuck
            super().write(cg + "/cgroup.events", f"populated 1\nfrozen {int(frozen)}\n")


class Clock:
    def __init__(self):
        self.now = 0

    def __call__(self):
        return self.now


def tree(tmp_path, names=("a", "b", "c"), rt=False):
    fs = FreezerFS(tmp_path)
    for n in names:
        for i in range(2):
            (tmp_path / f"sys/fs/cgroup/unified/machine/{n}/vcpu{i}").mkdir(parents=True)
            (tmp_path / f"sys/fs/cgroup/cpu/machine/{n}/vcpu{i}").mkdir(parents=True)
    for n in names:
        for i in range(2):
            fs.write(f"{CG2}/machine/{n}/vcpu{i}/cgroup.freeze", "0")
            if rt:
                fs.write(f"{CPU}/machine/{n}/vcpu{i}/cpu.rt_runtime_us", "0")
        if rt:
            fs.write(f"{CPU}/machine/{n}/cpu.rt_runtime_us", "0")
    if rt:
        fs.write(f"{CPU}/machine/cpu.rt_runtime_us", "0")
    return fs


def member(n, slot=50, prio=0, rt=False, rt_us=None, original=SchedAttr()):
    tid = {"a": 100, "b": 200, "c": 300, "d": 400}[n]
    chain = lambda i: (f"{CPU}/machine/cpu.rt_runtime_us", f"{CPU}/machine/{n}/cpu.rt_runtime_us",
                       f"{CPU}/machine/{n}/vcpu{i}/cpu.rt_runtime_us") if rt else ()
    return pr.MemberPlan(n, n, slot, prio, tuple(
        pr.VcpuPlan(i, tid + i, f"{CG2}/machine/{n}/vcpu{i}/cgroup.freeze", chain(i), original) for i in range(2)), rt_us)


def gang(*members, mode="freeze", max_stall_ms=500, rt_top_us=None):
    return pr.Plan(1, max_stall_ms, rt_top_us, (pr.CellPlan("gang", mode, members),))


def thawed(fs, names):
    return [n for n in names if fs.read(f"{CG2}/machine/{n}/vcpu0/cgroup.freeze") == "0"]


def test_rotation_one_guest_thawed_at_a_time(tmp_path):
    fs, clock = tree(tmp_path), Clock()
    sw = Switcher(fs, 500 * MS, clock=clock)
    sw.apply(gang(member("a"), member("b"), member("c")))
    seen = []
    for step in range(9):
        assert thawed(fs, "abc") == [seen_name := "abc"[step % 3]]
        seen.append(seen_name)
        clock.now += 50 * MS
        assert sw.tick() == clock.now + 50 * MS
    assert seen == list("abcabcabc")
    stats = sw.take_stats()
    assert stats.switches == {"gang": 9}
    assert len(stats.latency_ns) == 9 and stats.forced_thaws == 0
    # each guest was frozen 100 ms per 150 ms cycle
    assert pr.Costop("a", 0, 3 * 100 * MS) in stats.costop   # thawed again at 150, 300 and 450 ms


def test_freeze_completes_before_thaw(tmp_path):
    fs, clock = tree(tmp_path), Clock()
    sw = Switcher(fs, 500 * MS, clock=clock)
    sw.apply(gang(member("a"), member("b")))
    fs.writes.clear()
    clock.now += 50 * MS
    sw.tick()
    order = [(p.split("/")[-3], d) for p, d in fs.writes if p.endswith("cgroup.freeze")]
    assert order == [("a", "1"), ("a", "1"), ("b", "0"), ("b", "0")]


def test_release_thaws_and_returns_each_boost_to_its_recorded_attributes(tmp_path):
    fs, clock, sched = tree(tmp_path), Clock(), FakeSched()
    batch = SchedAttr("batch", nice=5)
    deadline = SchedAttr("deadline", runtime_ns=1 * MS, deadline_ns=10 * MS, period_ns=10 * MS)
    sw = Switcher(fs, 500 * MS, sched=sched.knob(fs), clock=clock)
    sw.apply(gang(member("a", prio=1, original=batch), member("b", prio=1, original=deadline), member("c", prio=1)))
    assert sched.attrs[100] == SchedAttr("fifo", priority=1) and 200 not in sched.attrs
    clock.now += 50 * MS
    sw.tick()
    assert sched.attrs[100] == batch and sched.attrs[200] == SchedAttr("fifo", priority=1)
    sw.release_all()
    assert thawed(fs, "abc") == list("abc")
    assert sched.attrs == {100: batch, 101: batch, 200: deadline, 201: deadline}


def test_removed_guest_is_released_mid_rotation(tmp_path):
    fs, clock = tree(tmp_path), Clock()
    sw = Switcher(fs, 500 * MS, clock=clock)
    sw.apply(gang(member("a"), member("b"), member("c")))
    assert thawed(fs, "abc") == ["a"]
    sw.apply(gang(member("a"), member("b")))          # c stopped being managed while frozen
    assert thawed(fs, "abc") == ["a", "c"]


def test_vanished_vcpu_is_harmless(tmp_path):
    fs, clock = tree(tmp_path), Clock()
    sw = Switcher(fs, 500 * MS, clock=clock)
    sw.apply(gang(member("a"), member("b")))
    import shutil
    shutil.rmtree(tmp_path / "sys/fs/cgroup/unified/machine/b")       # domain destroyed mid-slot
    clock.now += 50 * MS
    sw.tick()
    clock.now += 50 * MS
    sw.tick()
    assert thawed(fs, "a") == ["a"]
    assert not sw.take_stats().errors                    # ENOENT is normal life


def test_force_thaw_after_max_stall(tmp_path):
    fs, clock = tree(tmp_path), Clock()
    sw = Switcher(fs, 120 * MS, clock=clock)
    sw.apply(gang(member("a", slot=100), member("b", slot=100), max_stall_ms=120))
    clock.now += 99 * MS
    sw.tick()
    assert thawed(fs, "ab") == ["a"]
    # the loop was held up far past a slot: b must not stay frozen
    clock.now += 400 * MS
    sw.tick()
    assert "b" in thawed(fs, "ab")


def test_eperm_boost_falls_back_to_freeze_only(tmp_path):
    fs, clock = tree(tmp_path), Clock()
    sw = Switcher(fs, 500 * MS, sched=FakeSched(fail={"fifo": errno.EPERM}).knob(fs), clock=clock)
    sw.apply(gang(member("a", prio=1), member("b", prio=1)))
    stats = sw.take_stats()
    assert stats.boost_failed["gang"].startswith("boost impossible for domain a")
    assert any("freeze-only" in e for e in stats.errors)
    clock.now += 50 * MS
    sw.tick()
    assert thawed(fs, "ab") == ["b"]                     # rotation goes on


def test_ebusy_freeze_write_is_reported_not_fatal(tmp_path, monkeypatch):
    fs, clock = tree(tmp_path), Clock()
    sw = Switcher(fs, 500 * MS, clock=clock)
    real = fs.write

    def busy(path, data):
        if path.endswith("machine/b/vcpu0/cgroup.freeze"):
            raise OSError(errno.EBUSY, "busy")
        real(path, data)
    monkeypatch.setattr(fs, "write", busy)
    sw.apply(gang(member("a"), member("b")))
    assert any("domain=b vcpu=0" in e and "busy" in e for e in sw.take_stats().errors)


def test_rt_runtime_granted_statically_and_restored(tmp_path):
    fs, clock = tree(tmp_path, rt=True), Clock()
    sw = Switcher(fs, 500 * MS, rt_top_us=900_000, sched=FakeSched().knob(fs), clock=clock)
    sw.apply(gang(member("a", prio=1, rt=True, rt_us=100_000), member("b", prio=1, rt=True, rt_us=100_000),
                  rt_top_us=900_000))
    rt = lambda p: fs.read(f"{CPU}/machine/{p}cpu.rt_runtime_us")
    assert rt("") == "900000" and rt("a/") == "200000" and rt("b/vcpu1/") == "100000"
    clock.now += 50 * MS
    sw.tick()
    assert rt("a/vcpu0/") == "100000"                    # kept between slots: no throttle debt
    sw.release_all()
    assert {rt(p) for p in ("", "a/", "a/vcpu0/", "b/vcpu1/")} == {"0"}


def test_protocol_round_trips_every_message():
    plan = gang(member("a", prio=3, rt=True, rt_us=5, original=SchedAttr("batch", nice=2)), member("b"))
    stats = pr.Stats(switches={"gang": 2}, latency_ns=(1, 2), costop=(pr.Costop("a", 1, 7),), errors=("x",),
                     active={"gang": "a"}, released=True)
    for msg in (plan, pr.Stop(), pr.Ready(True), pr.Applied(4), stats):
        line = pr.encode(msg)
        assert line.endswith("\n") and line.count("\n") == 1
        assert pr.decode(line) == msg


def test_protocol_names_a_bad_message():
    import pytest
    with pytest.raises(ValueError, match="bad message"):
        pr.decode('{"type": "plan", "seq": 1}')
    with pytest.raises(ValueError, match="bad message"):
        pr.decode('{"type": "launch"}')
