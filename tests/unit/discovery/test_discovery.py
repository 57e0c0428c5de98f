import pytest

from cosched.discovery import build_domain, build_snapshot
from cosched.discovery.host import cgroup_layout, read_host
from cosched.discovery.libvirt import DomainFacts
from cosched.discovery.threads import Placed, find_qemu_pid, live_state, vcpu_threads
from cosched.hostfs import FD_SETSIZE, HostFS, parse_cpu_list
from cosched.policy.presets import Presets
from tests.support.fakehost import FakeHost

UUID = "11111111-2222-3333-4444-555555555555"
GANG_XML = f"""<domain type='qemu'><name>vm1</name><uuid>{UUID}</uuid><metadata>
<cosched:policy xmlns:cosched="urn:cosched:libvirt:1" name="gang" quantum-ms="20"/></metadata></domain>"""


def test_cpu_list_format():
    assert parse_cpu_list("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert parse_cpu_list("") == ()


def test_a_file_is_read_whole_as_text_mode_reads_it(tmp_path):
    fs = HostFS(tmp_path)
    (tmp_path / "proc/1").mkdir(parents=True)
    data = b"a\r\nb\rc\n\xff" + b"x" * 200_000          # line ends, a byte that is no UTF-8, more than one read
    (tmp_path / "proc/1/stat").write_bytes(data)
    with open(tmp_path / "proc/1/stat", encoding="utf-8", errors="replace") as f:
        expected = f.read()
    assert fs.read("/proc/1/stat") == expected and expected.startswith("a\nb\nc\n\ufffd") and len(expected) == 200_007
    assert fs.read_bytes("proc/1/stat") == data
    assert fs.read_or("/proc/2/stat", "gone") == "gone"


def test_the_open_files_limit_is_raised_and_kept_descriptors_leave_select_room():
    """In a process of its own started with systemd's soft limit of 1,024
    open files: descriptors kept open stay where they are while the limit
    leaves no room above ``FD_SETSIZE``; once raised to the hard limit they
    go above it, so a descriptor opened after them (a pidfd the switcher
    selects on) still takes a low number."""
    import resource
    import subprocess
    import sys
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard <= FD_SETSIZE:
        pytest.skip(f"the hard limit of open files here is {hard}: no room above FD_SETSIZE")
    code = f"""
import os, resource
from cosched.hostfs import FD_SETSIZE, HostFS, raise_open_files_limit
resource.setrlimit(resource.RLIMIT_NOFILE, ({FD_SETSIZE}, {hard}))
fs = HostFS("/")
before = fs.open_fd("/proc/self/stat")
print(before, *raise_open_files_limit())
kept = [fs.open_fd("/proc/self/stat") for _ in range(3)]
f = fs.open_file("/proc/self/stat")
f.read()
print(*kept, f.fd, os.open("/proc/self/stat", os.O_RDONLY), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    before, old, new = map(int, out[0].split())
    *kept, other, limit = map(int, out[1].split())
    assert before < FD_SETSIZE and (old, new, limit) == (FD_SETSIZE, hard, hard)
    assert len(kept) == 4 and all(fd >= FD_SETSIZE for fd in kept), kept
    assert other < FD_SETSIZE


def test_host_topology_smt_and_numa(tmp_path):
    FakeHost(tmp_path, cpus=8, smt=2, nodes=2)
    host = read_host(HostFS(tmp_path))
    assert host.cpus == tuple(range(8))
    assert host.siblings(0) == (0, 1)
    assert len(host.cores) == 4
    assert host.nodes == (0, 1)
    assert host.node_of[5] == 1


def test_cgroup_layouts(tmp_path):
    FakeHost(tmp_path / "h", mode="hybrid")
    FakeHost(tmp_path / "u", mode="unified")
    assert cgroup_layout(HostFS(tmp_path / "h")) == ("hybrid", "/sys/fs/cgroup/unified")
    assert cgroup_layout(HostFS(tmp_path / "u")) == ("unified", "/sys/fs/cgroup")
    (tmp_path / "l/proc/self").mkdir(parents=True)
    (tmp_path / "l/proc/self/mountinfo").write_text("32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n")
    assert cgroup_layout(HostFS(tmp_path / "l")) == ("legacy", None)


def test_vcpu_threads_from_name_and_cgroup(fake, fs):
    fake.qemu(100, "vm1", UUID, {0: 101, 1: 102})
    fake.freeze("/machine/qemu-1-vm1.libvirt-qemu/vcpu1", True)
    vcpus, warnings = vcpu_threads(fs, 100, fake.cg2)
    assert [(v.index, v.tid) for v in vcpus] == [(0, 101), (1, 102)]
    assert vcpus[0].sched == "other" and warnings == ()
    # what changes all the time is read when asked
    live = [live_state(fs, fake.cg2, v, 100) for v in vcpus]
    assert [x["frozen"] for x in live] == [False, True] and live[0]["cpus"] == [0, 1]


def test_a_resync_reads_one_stat_per_vcpu_thread_it_knows(fake, fs):
    fake.qemu(100, "vm1", UUID, {0: 101, 1: 102})
    placed = Placed()
    first, _ = vcpu_threads(fs, 100, fake.cg2, placed=placed)
    for tid in (101, 102):                             # what a known, placed thread need not show again
        (fake.root / f"proc/100/task/{tid}/comm").unlink()
        (fake.root / f"proc/100/task/{tid}/cgroup").unlink()
    again, _ = vcpu_threads(fs, 100, fake.cg2, placed=placed)
    assert again == first
    fake.thread(100, 102, "CPU 1/TCG", "/machine/qemu-1-vm1.libvirt-qemu/vcpu1")   # a TID reused: read afresh
    fake.stat(100, 102, "CPU 1/TCG")
    (fake.root / "proc/100/task/102/stat").write_text((fake.root / "proc/100/task/102/stat").read_text().replace(
        " 1102 ", " 9999 "))
    assert vcpu_threads(fs, 100, fake.cg2, placed=placed)[0][1].start_time == 9999


def test_vcpu_threads_without_cgroups_use_names(fake, fs):
    fake.qemu(100, "vm1", UUID, {0: 101, 1: 102}, accel="KVM", cgroups=False)
    vcpus, _ = vcpu_threads(fs, 100, fake.cg2)
    assert [(v.index, v.tid) for v in vcpus] == [(0, 101), (1, 102)]


def test_cgroup_wins_when_name_disagrees(fake, fs):
    fake.qemu(100, "vm1", UUID, {0: 101})
    fake.thread(100, 102, "CPU 5/KVM", "/machine/qemu-1-vm1.libvirt-qemu/vcpu1")
    vcpus, warnings = vcpu_threads(fs, 100, fake.cg2)
    assert [(v.index, v.tid) for v in vcpus] == [(0, 101), (1, 102)]
    assert len(warnings) == 1 and "tid=102" in warnings[0]


def test_fifo_thread_reported(fake, fs):
    fake.qemu(100, "vm1", UUID, {})
    fake.thread(100, 101, "CPU 0/TCG", "/machine/x/vcpu0", policy=1, prio=5, cpus="1")
    (v,) = vcpu_threads(fs, 100, fake.cg2)[0]
    assert (v.sched, v.priority, live_state(fs, fake.cg2, v, 100)["cpus"]) == ("fifo", 5, [1])


def test_vanished_process_gives_no_vcpus(fs):
    assert vcpu_threads(fs, 4242, None) == ((), ())


def test_qemu_pid_from_pidfile_checked_by_uuid(fake, fs):
    fake.qemu(100, "vm1", UUID, {0: 101})
    assert find_qemu_pid(fs, "vm1", UUID) == 100
    # a stale pid file pointing at another process is not trusted
    fake.write("/run/libvirt/qemu/vm1.pid", "999")
    fake.write("/proc/999/cmdline", b"/bin/sleep\x00100\x00")
    assert find_qemu_pid(fs, "vm1", UUID) == 100
    assert find_qemu_pid(fs, "vm1", "00000000-0000-0000-0000-000000000000") is None


def test_snapshot_with_valid_invalid_and_default(fake, fs):
    fake.qemu(100, "vm1", UUID, {0: 101, 1: 102})
    bad_uuid = UUID.replace("1", "9")
    fake.qemu(200, "vm2", bad_uuid, {0: 201})
    fake.qemu(300, "vm3", UUID.replace("2", "8"), {0: 301})
    bad = GANG_XML.replace('quantum-ms="20"', 'quantum-ms="fast"')
    facts = [DomainFacts("vm1", UUID, GANG_XML), DomainFacts("vm2", bad_uuid, bad),
             DomainFacts("vm3", UUID.replace("2", "8"), "<domain><name>vm3</name></domain>")]
    snap = build_snapshot(fs, facts, Presets.load([]), "none")
    vm1, vm2, vm3 = snap.domains
    assert vm1.policy.preset == "gang" and dict(vm1.policy.params)["quantum-ms"] == 20 and vm1.error is None
    assert vm2.policy is None and "quantum-ms" in vm2.error
    assert [v.tid for v in vm2.vcpus] == [201]          # still observed
    assert vm3.policy.preset == "none" and vm3.policy.source == "default"
    assert snap.host.cgroup == "hybrid"


def test_a_task_beside_a_vcpu_in_its_cgroup_is_seen(fake, fs):
    fake.qemu(100, "vm1", UUID, {0: 101, 1: 102})
    fake.write(f"{fake.cg2}/machine/qemu-1-vm1.libvirt-qemu/vcpu0/cgroup.threads", "101\n4242\n")
    fake.write(f"{fake.cg2}/machine/qemu-1-vm1.libvirt-qemu/vcpu1/cgroup.threads", "102\n")
    (vm1,) = build_snapshot(fs, [DomainFacts("vm1", UUID, GANG_XML)], Presets.load([]), "none").domains
    assert [v.cgroup_shared for v in vm1.vcpus] == [(4242,), ()]


def test_a_guest_s_confinement_is_read_from_its_cgroup_cpuset_and_its_threads_first_affinity(tmp_path):
    """The guest's cgroup (the parent of libvirt's ``vcpuN`` cgroups, whose
    own cpusets libvirt rewrites when it pins) bounds every vCPU; each
    thread's affinity is the one it had when first seen placed."""
    fake = FakeHost(tmp_path, cpus=4)
    fs = HostFS(tmp_path)
    fake.qemu(100, "vm1", UUID, {0: 101, 1: 102})
    fake.thread(100, 102, "CPU 1/TCG", "/machine/qemu-1-vm1.libvirt-qemu/vcpu1", cpus="1-2")
    scope = "/sys/fs/cgroup/cpuset/machine/qemu-1-vm1.libvirt-qemu"
    fake.write(f"{scope}/cpuset.effective_cpus", "1-3\n")
    fake.write(f"{scope}/vcpu0/cpuset.effective_cpus", "3\n")        # libvirt's pin: not the bound
    placed = Placed()
    (vm1,) = build_snapshot(fs, [DomainFacts("vm1", UUID, GANG_XML)], Presets.load([]), "none", placed=placed).domains
    assert vm1.cputune.cgroup_cpus == (1, 2, 3)
    assert [v.cpus for v in vm1.vcpus] == [(0, 1), (1, 2)]
    fake.thread(100, 102, "CPU 1/TCG", "/machine/qemu-1-vm1.libvirt-qemu/vcpu1", cpus="3")   # cosched's pin
    (vm1,) = build_snapshot(fs, [DomainFacts("vm1", UUID, GANG_XML)], Presets.load([]), "none", placed=placed).domains
    assert [v.cpus for v in vm1.vcpus] == [(0, 1), (1, 2)]
    fake.write(f"{scope}/cpuset.effective_cpus", "0-3\n")
    (vm1,) = build_snapshot(fs, [DomainFacts("vm1", UUID, GANG_XML)], Presets.load([]), "none", placed=placed).domains
    assert vm1.cputune.cgroup_cpus is None


def test_a_vcpu_found_under_fifo_is_realtime_one_boosted_later_is_not(tmp_path):
    fake = FakeHost(tmp_path)
    fs = HostFS(tmp_path)
    fake.qemu(100, "vm1", UUID, {0: 101, 1: 102})
    fake.thread(100, 101, "CPU 0/TCG", "/machine/qemu-1-vm1.libvirt-qemu/vcpu0", policy=1, prio=1)   # SCHED_FIFO
    placed = Placed()
    (vm1,) = build_snapshot(fs, [DomainFacts("vm1", UUID, GANG_XML)], Presets.load([]), "none", placed=placed).domains
    assert [v.realtime for v in vm1.vcpus] == [True, False]
    fake.thread(100, 102, "CPU 1/TCG", "/machine/qemu-1-vm1.libvirt-qemu/vcpu1", policy=1, prio=1)   # a boost
    (vm1,) = build_snapshot(fs, [DomainFacts("vm1", UUID, GANG_XML)], Presets.load([]), "none", placed=placed).domains
    assert [v.realtime for v in vm1.vcpus] == [True, False] and vm1.vcpus[1].sched == "fifo"


def test_domain_whose_process_is_gone(fs):
    d = build_domain(fs, read_host(fs), DomainFacts("vm1", UUID, GANG_XML), Presets.load([]), "none")
    assert d.pid is None and d.vcpus == ()


def test_the_platform_s_cpu_decisions_are_read_from_the_domain_xml():
    from cosched.discovery.cputune import parse_cputune
    from cosched.model import CpuTune
    nova = ("<domain><vcpu placement='static' cpuset='0-3'>2</vcpu><cputune><vcpupin vcpu='0' cpuset='2'/>"
            "<vcpupin vcpu='1' cpuset='3'/><emulatorpin cpuset='0-1'/></cputune></domain>")
    assert parse_cputune(nova, 2) == CpuTune(pins=((0, (2,)), (1, (3,))), emulator=(0, 1))
    rt = ("<domstatus><domain><vcpu cpuset='1-3,^2'>2</vcpu><cputune><vcpusched vcpus='0-1' scheduler='fifo' "
          "priority='1'/></cputune></domain></domstatus>")
    assert parse_cputune(rt, 2) == CpuTune(pins=((0, (1, 3)), (1, (1, 3))), realtime=(0, 1))
    assert parse_cputune("<domain><cputune><vcpusched vcpus='0' scheduler='other'/></cputune></domain>", 2) == CpuTune()
    assert parse_cputune("<domain", 2) == CpuTune()
