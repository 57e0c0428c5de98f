"""KVM's spin and halt counters, from a fake debugfs and fake libvirt statistics, and what auto makes of them.

The development hosts run TCG only, so these counters never exist there:
the sources are tested on fake trees and records shaped as the kernel and
libvirt document them."""
from cosched.hostfs import HostFS
from cosched.model import Domain, Host, PolicySpec, Snapshot, Vcpu
from cosched.policy.auto import Auto, Chooser, Evidence
from cosched.policy.params import resolve
from cosched.policy.plan import PlanConfig, plan
from cosched.sampler import DomainView, VcpuView
from cosched.sampler.kvm import KvmCounts, KvmStats, from_libvirt_stats

from tests.support.fakehost import HYBRID_MOUNTINFO, FakeHost

DEBUGFS = "25 20 0:7 / /sys/kernel/debug rw,nosuid,nodev,noexec,relatime shared:12 - debugfs debugfs rw\n"


def snap(*domains) -> Snapshot:
    host = Host(cpus=(0, 1), core_of={0: (0, 0), 1: (0, 1)}, node_of={0: 0, 1: 0}, cgroup="hybrid",
                cgroup2_mount="/sys/fs/cgroup/unified")
    return Snapshot(host, tuple(domains))


def dom(name, pid, kind="auto"):
    spec = PolicySpec(kind, kind, resolve(kind, {}, {}), "annotation")
    vcpus = tuple(Vcpu(i, 10 * pid + i, f"/m/{name}/vcpu{i}", start_time=1) for i in range(2))
    return Domain(name, f"u-{name}", pid, vcpus, spec)


def test_debugfs_gives_each_guest_the_sum_over_its_vcpus(tmp_path):
    fake = FakeHost(tmp_path)
    fake.write("/proc/self/mountinfo", HYBRID_MOUNTINFO + DEBUGFS)
    fake.write("/sys/kernel/debug/kvm/100-12/directed_yield_attempted", "52000\n")
    fake.write("/sys/kernel/debug/kvm/100-12/halt_exits", "7\n")
    fake.write("/sys/kernel/debug/kvm/200-12/directed_yield_attempted", "not a number\n")
    fake.write("/sys/kernel/debug/kvm/200-12/halt_exits", "1\n")
    got = KvmStats(HostFS(tmp_path)).read(snap(dom("a", 100), dom("b", 200), dom("c", 300)))
    assert got == {"u-a": KvmCounts(52000, 7, "debugfs")}         # b unreadable, c has no KVM virtual machine


def test_without_debugfs_or_kvm_nothing_is_read(tmp_path):
    FakeHost(tmp_path)                                            # no debugfs in mountinfo: a TCG host as these
    assert KvmStats(HostFS(tmp_path)).read(snap(dom("a", 100))) == {}


def test_libvirt_statistics_first_debugfs_for_the_rest(tmp_path):
    fake = FakeHost(tmp_path)
    fake.write("/proc/self/mountinfo", HYBRID_MOUNTINFO + DEBUGFS)
    fake.write("/sys/kernel/debug/kvm/200-9/directed_yield_attempted", "3\n")
    fake.write("/sys/kernel/debug/kvm/200-9/halt_exits", "4\n")
    records = {"u-a": {"vcpu.current": 2, "vcpu.0.time": 10, "vcpu.0.directed_yield_attempted.sum": 5,
                       "vcpu.1.directed_yield_attempted.sum": 6, "vcpu.0.halt_exits.sum": 1,
                       "vcpu.1.halted": True}}
    got = KvmStats(HostFS(tmp_path), lambda: records).read(snap(dom("a", 100), dom("b", 200)))
    assert got == {"u-a": KvmCounts(11, 1, "libvirt"), "u-b": KvmCounts(3, 4, "debugfs")}


def test_libvirt_records_without_hypervisor_counters_give_nothing():
    assert from_libvirt_stats({"vcpu.current": 2, "vcpu.0.state": 1, "vcpu.0.time": 5, "vcpu.0.delay": 3}) is None


def test_a_libvirt_that_never_has_counters_is_asked_once_a_minute(tmp_path, caplog):
    FakeHost(tmp_path)
    calls, now = [], [0.0]

    def stats():
        calls.append(now[0])
        return {"u-a": {"vcpu.0.time": 1}}
    kvm = KvmStats(HostFS(tmp_path), stats, clock=lambda: now[0])
    for t in range(125):
        now[0] = float(t)
        kvm.read(snap(dom("a", 100)))
    assert calls == [0.0, 1.0, 2.0, 62.0, 122.0]


def test_a_failing_libvirt_is_said_once_and_debugfs_still_answers(tmp_path, caplog):
    fake = FakeHost(tmp_path)
    fake.write("/proc/self/mountinfo", HYBRID_MOUNTINFO + DEBUGFS)
    fake.write("/sys/kernel/debug/kvm/100-3/directed_yield_attempted", "8\n")
    fake.write("/sys/kernel/debug/kvm/100-3/halt_exits", "0\n")

    def broken():
        raise ConnectionError("libvirt went away")
    kvm = KvmStats(HostFS(tmp_path), broken)
    for _ in range(3):
        assert kvm.read(snap(dom("a", 100))) == {"u-a": KvmCounts(8, 0, "debugfs")}
    assert caplog.text.count("action=kvm-stats-unreadable source=libvirt") == 1


def busy_pair_under_auto(spins_per_second: dict[str, int]) -> Auto:
    """Two guests whose vCPUs never idle and wait as long as they run (the
    host scheduler's figures cannot tell them apart), fed KVM counts that
    grow by ``spins_per_second`` of run time."""
    s = snap(dom("spinner", 100), dom("computer", 200))
    auto = Auto()
    for t in range(12):
        views = {d.uuid: DomainView(d.uuid, d.name, tuple(VcpuView(v.index, v.tid, 0.5 * t, 0.5 * t) for v in d.vcpus),
                                    hazard=0.0, partial=0.0, observed=float(t), skew_buckets=(), skew_sum=0.0,
                                    skew_count=0, last_skew=0.0) for d in s.domains}
        kvm = {d.uuid: KvmCounts(int(spins_per_second[d.name] * 1.0 * t), 0, "debugfs") for d in s.domains}
        auto.step(float(t), s, views, {}, pool_cpus=2, kvm=kvm)
    auto.settle(s, lambda x: plan(x, PlanConfig()))
    return auto


def test_kvm_counters_tell_a_spinning_guest_from_a_computing_one():
    auto = busy_pair_under_auto({"spinner": 40000, "computer": 2})
    assert auto.mode("u-spinner") == "gang"
    assert auto.mode("u-computer") == "none" and "u-computer" in auto.hosted      # busy: a slot beside the gang
    signals = auto.explain("u-computer")["signals"]
    assert signals["spins_per_run_second"] < 20 and auto.explain("u-spinner")["last_window"]["spins"] > 1000


def test_without_kvm_counters_the_same_pair_is_co_scheduled_alike():
    auto = busy_pair_under_auto({"spinner": 0, "computer": 0})
    assert auto.mode("u-spinner") == auto.mode("u-computer") == "none"         # counters say neither spins
    plain = Chooser()
    for t in range(12):
        plain.decide("g", float(t), Evidence(1.0, 2, run=1.0, wait=1.0), ("none", "gang"), 5)
    assert plain.mode("g") == "gang" and plain.explain("g")["signals"]["spins_per_run_second"] is None


def test_a_guest_that_halts_to_hand_off_keeps_gang_without_spinning():
    ch = Chooser()
    for t in range(12):     # a pipe ping-pong: a quarter of its active time idle, no spinning
        ch.decide("g", float(t), Evidence(1.0, 2, run=0.49, wait=1.33, spins=0.0), ("none", "gang"), 5)
    assert ch.mode("g") == "gang"
