"""The processes source manages only the QEMU the platform started: executable, file and user checked."""
import os

import pytest

from cosched.discovery.processes import ProcessSource
from cosched.trust import Trust, process_uids, verdict
from cosched.metrics import CoschedCollector

ARGV = ["/usr/bin/qemu-system-x86_64", "-name", "guest=vm,debug-threads=on", "-uuid", "u-1"]


def st(mode=0o100755, uid=0):
    return os.stat_result((mode, 1, 1, 1, uid, 0, 10, 0, 0, 0))


@pytest.mark.parametrize("path, st_, uids, reason", [
    ("/usr/bin/qemu-system-x86_64", st(), (0, 0), None),
    ("/usr/bin/kvm", st(), (64055, 64055), None),                              # Proxmox VE, as libvirt-qemu
    ("/home/eve/qemu-system-x86_64", st(uid=1000), (1000, 1000), "executable"),  # her own copy, anywhere
    ("/usr/bin/python3", st(), (1000, 1000), "executable"),                    # a script named like QEMU
    ("/usr/bin/qemu-system-x86_64", st(uid=1000), (0, 0), "file"),            # replaced by a user
    ("/usr/bin/qemu-system-x86_64", st(mode=0o100775), (0, 0), "file"),       # group may write it
    ("/usr/bin/qemu-system-x86_64", st(mode=0o100757), (0, 0), "file"),       # others may write it
    ("/usr/bin/qemu-system-x86_64", st(mode=0o040755), (0, 0), "file"),       # not a regular file
    ("/usr/bin/qemu-system-x86_64", st(), (1000, 1000), "user"),
    ("/usr/bin/qemu-system-x86_64", st(), (1000, 0), "user"),                 # setuid: the real user counts too
    ("/usr/bin/qemu-system-x86_64", st(), None, "user"),
])
def test_a_process_is_a_guest_only_if_its_executable_file_and_user_say_so(path, st_, uids, reason):
    got = verdict(path, st_, uids, Trust(users=frozenset({0, 64055})))
    assert (got[0] if got else None) == reason
    if got:
        assert path in got[1] or "uid" in got[1]


def test_status_gives_the_real_and_effective_user():
    assert process_uids("Name:\tqemu\nUid:\t64055\t0\t0\t0\nGid:\t1\n") == (64055, 0)
    assert process_uids("Name:\tqemu\n") is None


def test_untrusted_processes_are_ignored_said_once_and_counted(fake, fs, caplog):
    fake.process(100, ARGV)                                                    # trusted: the tree's own user
    fake.process(200, ARGV[:2] + ["guest=eve"], exe="/home/eve/qemu-system-x86_64")
    fake.process(300, ["qemu-system-x86_64", "-name", "spin"], exe="/usr/bin/python3")
    fake.process(400, ARGV[:2] + ["guest=writable"], exe="/opt/qemu/qemu-system-x86_64")
    os.chmod(fake.root / "opt/qemu/qemu-system-x86_64", 0o777)
    fake.process(500, ARGV[:2] + ["guest=other"], uid=12345)
    source = ProcessSource(fs, trust=Trust(emulators=("/usr/bin/qemu-system-*", "/opt/qemu/*"), owner=os.getuid(),
                                           users=frozenset({0, os.getuid()})))
    for _ in range(3):
        assert [f.pid for f in source.domains()] == [100]
    assert source.ignored == {200: "executable", 300: "executable", 400: "file", 500: "user"}
    said = [r.getMessage() for r in caplog.records if "action=process-ignored" in r.getMessage()]
    assert len(said) == 4 and any("pid=400 name=writable action=process-ignored reason=file" in m for m in said)

    class Daemonish:
        def health(self):
            return {"libvirt_connected": True, "samples": 0, "late_samples": 0, "sample_period": 0.01,
                    "preset_errors": 0, "switcher_realtime": None, "healthy": True,
                    "ignored_processes": {"executable": 2, "file": 1, "user": 1}}
    collector = CoschedCollector(lambda: None, dict, health=Daemonish().health)
    (family,) = [m for m in collector.collect() if m.name == "cosched_ignored_processes"]
    assert {s.labels["reason"]: s.value for s in family.samples} == {"executable": 2, "file": 1, "user": 1}


def test_a_replaced_binary_is_still_its_own_file(fake, fs):
    fake.process(100, ARGV)
    link = fake.root / "proc/100/exe"
    target = os.readlink(link)
    link.unlink()
    os.symlink(target + " (deleted)", link)                # how /proc shows a binary upgraded under a guest
    os.link(target, target + " (deleted)")                 # (the kernel still reaches the old inode)
    assert [f.pid for f in ProcessSource(fs, trust=fake.trust).domains()] == [100]


def test_a_guest_root_cannot_lead_the_daemon_out_of_it(fake, fs):
    fake.process(100, ARGV)
    fake.write("/secret/domain.xml", '<domstatus><domain><metadata><cosched:policy '
               'xmlns:cosched="urn:cosched:libvirt:1" name="gang"/></metadata></domain></domstatus>')
    run = fake.root / "proc/100/root/run/libvirt/qemu"
    run.mkdir(parents=True)
    (run / "vm.xml").symlink_to(fake.root / "secret/domain.xml")              # planted by the guest's side
    (facts,) = ProcessSource(fs, trust=fake.trust).domains()
    assert facts.xml == ""                                  # resolved inside its root: not there
    (run / "vm.xml").unlink()
    (run / "vm.xml").write_text("<domstatus>" + "x" * (2 << 20) + "</domstatus>")
    (facts,) = ProcessSource(fs, trust=fake.trust).domains()
    assert facts.xml == ""                                  # over the 1 MiB limit: not read
    (run / "vm.xml").write_text((fake.root / "secret/domain.xml").read_text())
    (facts,) = ProcessSource(fs, trust=fake.trust).domains()
    assert 'name="gang"' in facts.xml                      # a status file of its own is read
