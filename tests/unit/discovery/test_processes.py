"""Guests no host libvirtd runs: QEMU command lines, Proxmox VE tags, the /proc source, affinity pinning."""
import json
import shutil

import pytest
from tests.support.fakehost import FakeAffinity, FakeSched, ThreadSwitcher, reconcile

from cosched.actuators.journal import Journal
from cosched.annotation import AnnotationError, tag_policy
from cosched.config import ConfigError, from_dict
from cosched.discovery import Sources, build_snapshot
from cosched.discovery.processes import ProcessSource, pve_tags
from cosched.discovery.qemu import parse
from cosched.engine import Engine
from cosched.policy.presets import Presets

UUID = "6cf17dc3-8341-4ecc-aebd-7503f2583fb3"
# the shape qemu-server's own command line tests give (test/cfg2cmd/*.conf.cmd)
PVE_ARGV = ["/usr/bin/kvm", "-id", "8006", "-name", "vm8006,debug-threads=on", "-no-shutdown",
            "-chardev", "socket,id=qmp,path=/var/run/qemu-server/8006.qmp,server=on,wait=off",
            "-mon", "chardev=qmp,mode=control",
            "-chardev", "socket,id=qmp-event,path=/var/run/qmeventd.sock,reconnect-ms=5000",
            "-mon", "chardev=qmp-event,mode=control",
            "-pidfile", "/var/run/qemu-server/8006.pid", "-daemonize",
            "-smbios", f"type=1,uuid={UUID}", "-smp", "2,sockets=1,cores=2,maxcpus=2"]
LIBVIRT_ARGV = ["/usr/bin/qemu-system-x86_64", "-name", "guest=vm1,debug-threads=on", "-S",
                "-uuid", UUID, "-chardev", "socket,id=charmonitor,fd=37,server=on,wait=off",
                "-mon", "chardev=charmonitor,id=monitor,mode=control"]


def test_command_lines_name_the_guest_its_identity_and_qmp_socket():
    pve = parse(PVE_ARGV)
    assert (pve.name, pve.uuid, pve.vmid, pve.pidfile, pve.debug_threads) == (
        "vm8006", UUID, "8006", "/var/run/qemu-server/8006.pid", True)
    assert pve.qmp == "/var/run/qemu-server/8006.qmp"           # the server socket, not qmeventd's client one
    lv = parse(LIBVIRT_ARGV)
    assert (lv.name, lv.uuid, lv.vmid, lv.qmp) == ("vm1", UUID, None, None)   # libvirt passes its monitor as an fd
    hand = parse(["qemu-system-aarch64", "-name", "test", "-qmp", "unix:/tmp/q.sock,server,nowait"])
    assert (hand.name, hand.uuid, hand.qmp, hand.debug_threads) == ("test", None, "/tmp/q.sock", False)
    assert parse(["/usr/bin/python3", "-name", "x"]) is None
    assert parse(["qemu-system-x86_64", "-m", "512"]) is None     # nothing names the guest


def test_proxmox_tags_select_a_preset_and_its_parameters():
    presets = Presets.load([])
    spec = tag_policy(("prod", "cosched-gang-q20-w2-noboost"), presets, "none")
    assert (spec.preset, dict(spec.params)["quantum-ms"], dict(spec.params)["weight"]) == ("gang", 20, 2)
    assert dict(spec.params)["boost"] is False
    assert tag_policy(("web",), presets, "auto").preset == "auto"          # no cosched tag: the default
    assert dict(tag_policy(("cosched-relaxed-s4-t1",), presets, "none").params)["costop-ms"] == 4
    assert dict(tag_policy(("cosched-boost-r3",), presets, "none").params)["pause-ms"] == 3
    for bad, culprit in ((("cosched-fast",), "names no preset"), (("cosched-gang-x3",), "'x3' is no parameter"),
                         (("cosched-gang-q0",), "quantum-ms"), (("cosched-gang", "cosched-none"), "one cosched- tag")):
        with pytest.raises(AnnotationError, match=culprit) as e:
            tag_policy(bad, presets, "none")
        assert str(e.value).startswith("tag 'cosched-")


def test_pve_config_tags_come_from_the_running_section_only():
    conf = "boot: order=scsi0\ncores: 2\ntags: cosched-gang;prod\n\n[before-upgrade]\ntags: cosched-none\n"
    assert pve_tags(conf) == ("cosched-gang", "prod")
    assert pve_tags("cores: 2\n") == ()


def qemu_process(fake, pid, argv, vcpus, layout="/machine/qemu-9-{name}.libvirt-qemu"):
    """A QEMU process; libvirt's layout (emulator, vcpuN) unless ``layout`` ends in ``.scope``
    (Proxmox VE: every thread in the scope)."""
    name = parse(argv).name
    fake.process(pid, argv)
    scope = layout.format(name=name)
    own = not scope.endswith(".scope")
    fake.thread(pid, pid, "kvm", f"{scope}/emulator" if own else scope)
    for index, tid in vcpus.items():
        fake.thread(pid, tid, f"CPU {index}/KVM", f"{scope}/vcpu{index}" if own else scope)
    if not own:
        fake.write(f"{fake.cg2}{scope}/cgroup.threads", "")          # the kernel's own file


def test_the_process_source_finds_guests_no_host_libvirtd_runs(fake, fs):
    fake.qemu(100, "vm1", UUID.replace("6", "7"), {0: 101, 1: 102})            # the host libvirtd's: not ours
    qemu_process(fake, 200, PVE_ARGV, {0: 201, 1: 202})
    fake.write("/etc/pve/qemu-server/8006.conf", "cores: 2\ntags: cosched-gang-q20\n")
    hand = ["qemu-system-x86_64", "-name", "hand", "-smp", "2"]
    qemu_process(fake, 300, hand, {0: 301, 1: 302})
    kube = ["/usr/bin/qemu-system-x86_64", "-name", "guest=default_vmi-fedora,debug-threads=on", "-uuid", UUID[::-1]]
    qemu_process(fake, 400, kube, {0: 401})
    fake.write("/proc/400/root/run/libvirt/qemu/default_vmi-fedora.xml",
               '<domstatus state="running"><domain type="kvm"><name>default_vmi-fedora</name><metadata>'
               '<cosched:policy xmlns:cosched="urn:cosched:libvirt:1" name="relaxed"/></metadata></domain></domstatus>')
    facts = ProcessSource(fs, trust=fake.trust).domains()
    assert sorted((f.name, f.uuid, f.pid, f.source) for f in facts) == [
        ("default_vmi-fedora", UUID[::-1], 400, "qemu"), ("hand", "qemu-pid-300", 300, "qemu"),
        ("vm8006", UUID, 200, "qemu")]
    snap = build_snapshot(fs, facts, Presets.load([]), "none")
    by = {d.name: d for d in snap.domains}
    assert (by["vm8006"].policy.preset, dict(by["vm8006"].policy.params)["quantum-ms"]) == ("gang", 20)
    assert by["default_vmi-fedora"].policy.preset == "relaxed" and by["hand"].policy.preset == "none"
    assert [v.tid for v in by["vm8006"].vcpus] == [201, 202] and by["vm8006"].source == "qemu"
    assert by["vm8006"].vcpus[0].cgroup2 == "/machine/qemu-9-vm8006.libvirt-qemu/vcpu0"


def test_sources_keep_the_guests_of_one_that_cannot_answer():
    class Flaky:
        connected, last_error, calls = True, None, 0

        def domains(self):
            self.calls += 1
            if self.calls > 1:
                self.connected, self.last_error = False, "libvirtd gone"
                return None
            from cosched.discovery import DomainFacts
            return [DomainFacts("a", "u")]

    class Fixed:
        connected, last_error = True, None

        def domains(self):
            from cosched.discovery import DomainFacts
            return [DomainFacts("b", "v", source="qemu")]
    both = Sources([Flaky(), Fixed()])
    assert [f.name for f in both.domains()] == ["a", "b"] and both.connected
    assert [f.name for f in both.domains()] == ["a", "b"]
    assert not both.connected and both.last_error == "libvirtd gone"


def test_sources_are_configured_by_name():
    assert from_dict({"sources": ["processes"]}).sources == ("processes",)
    assert from_dict({"sources": []}).sources == ()                  # the host decides
    for bad in (["libvirt", "libvirt"], ["xen"]):
        with pytest.raises(ConfigError, match="sources"):
            from_dict({"sources": bad})


def test_a_proxmox_host_without_libvirt_finds_its_guests_as_processes(fake, fs):
    from cosched.discovery import host_sources
    assert host_sources(fs)[0] == ("libvirt",)
    (fake.root / "etc/pve").mkdir(parents=True)
    names, why = host_sources(fs)
    assert names == ("processes",) and "Proxmox VE" in why
    fake.write("/run/libvirt/libvirt-sock", "")                       # a Proxmox host that runs libvirtd as well
    assert host_sources(fs)[0] == ("libvirt",)


def test_a_process_guest_is_pinned_through_its_threads_and_restored(fake, fs, tmp_path):
    argv = lambda n, u: ["qemu-system-x86_64", "-name", n, "-uuid", u]
    uuids = [UUID, UUID.replace("6", "8")]
    for i, u in enumerate(uuids):
        qemu_process(fake, 100 * (i + 1), argv(f"vm{i}", u), {0: 100 * (i + 1) + 1, 1: 100 * (i + 1) + 2})
        fake.write(f"/etc/pve/qemu-server/{i}.conf", "")
        for v in range(2):
            fake.write(f"/sys/fs/cgroup/unified/machine/qemu-9-vm{i}.libvirt-qemu/vcpu{v}/cgroup.freeze", "0")
    gang = '<domain><metadata><cosched:policy xmlns:cosched="urn:cosched:libvirt:1" name="gang" quantum-ms="200"/>' \
           '</metadata></domain>'
    facts = [f.__class__(f.name, f.uuid, xml=gang, pid=f.pid, source=f.source) for f in ProcessSource(fs, trust=fake.trust).domains()]
    snap = build_snapshot(fs, facts, Presets.load([]), "none")
    affinity, journal = FakeAffinity(), Journal(str(tmp_path / "run/journal"))
    knob = FakeSched().knob(fs)
    engine = Engine(fs, journal, sched=knob, affinity=affinity.knob(fs),
                    switcher_factory=ThreadSwitcher.factory(fs, knob))
    try:
        reconcile(engine, snap)
        assert affinity.now == {101: (0,), 102: (1,), 201: (0,), 202: (1,)}
        assert sorted(e["kind"] for e in journal.entries.values() if e["kind"] == "affinity") == ["affinity"] * 4
    finally:
        assert engine.release() == []
    assert affinity.now == {tid: (0, 1) for tid in (101, 102, 201, 202)} and len(journal) == 0


class CgroupFS:
    """A fake cgroup v2 tree where writing a TID to ``cgroup.threads`` moves
    the thread (its /proc cgroup files follow), ``cgroup.events`` follows
    ``cgroup.freeze``, and a cgroup's directory goes with its control files."""

    def __new__(cls, fake):
        from tests.support.fakehost import CgroupEventsFS

        class FS(CgroupEventsFS):
            def write(self, host_path, data):
                super().write(host_path, data)
                if host_path.endswith("/cgroup.threads"):
                    rel = host_path.rsplit("/", 1)[0][len(fake.cg2):] or "/"
                    for p in (self.root / "proc").glob(f"*/task/{data}/cgroup"):
                        p.write_text(f"0::{rel}\n")
                    (self.root / f"proc/{data}/cgroup").write_text(f"0::{rel}\n")

            def mkdir(self, host_path):
                super().mkdir(host_path)
                for name, text in (("cgroup.freeze", "0"), ("cgroup.events", "populated 0\nfrozen 0\n"),
                                   ("cgroup.type", "domain"), ("cgroup.threads", "")):
                    (self.path(host_path) / name).write_text(text)

            def rmdir(self, host_path):
                import shutil
                shutil.rmtree(self.path(host_path))
        return FS(fake.root)


def test_a_proxmox_guest_gets_per_vcpu_cgroups_is_frozen_per_vcpu_and_given_back(tmp_path):
    from tests.support.fakehost import FakeHost
    fake = FakeHost(tmp_path, mode="unified")                # Proxmox VE hosts are pure cgroup v2
    fs = CgroupFS(fake)
    for n, vmid in enumerate((8006, 8007)):
        argv = ["/usr/bin/kvm", "-id", str(vmid), "-name", f"vm{vmid},debug-threads=on",
                "-smbios", f"type=1,uuid={UUID[:-1]}{n}"]
        qemu_process(fake, 100 * (n + 1), argv, {0: 100 * (n + 1) + 1, 1: 100 * (n + 1) + 2},
                     layout=f"/qemu.slice/{vmid}.scope")
        fake.write(f"/etc/pve/qemu-server/{vmid}.conf", "tags: cosched-gang-q200\n")
    scope_files = {str(p.relative_to(tmp_path)) for p in (tmp_path / "sys").rglob("*")}
    source = ProcessSource(fs, trust=fake.trust)
    build = lambda: build_snapshot(fs, source.domains(), Presets.load([]), "none")
    resyncs = []
    knob = FakeSched().knob(fs)
    journal = Journal(str(tmp_path / "run/journal"))
    engine = Engine(fs, journal, sched=knob, affinity=FakeAffinity().knob(fs),
                    switcher_factory=ThreadSwitcher.factory(fs, knob), resync=lambda: resyncs.append(1))
    try:
        first = reconcile(engine, build())
        assert resyncs and not first.cells                     # moved first, planned on the next snapshot
        assert "not (yet) in per-vCPU cgroups" in first.rejected[f"{UUID[:-1]}0"]
        snap = build()
        assert [v.cgroup2 for v in snap.domains[0].vcpus] == ["/qemu.slice/8006.scope/vcpu0",
                                                               "/qemu.slice/8006.scope/vcpu1"]
        assert fs.read("/sys/fs/cgroup/qemu.slice/8006.scope/vcpu0/cgroup.type") == "threaded"
        plan = reconcile(engine, snap)
        assert [m.name for m in plan.cells[0].members] == ["vm8006", "vm8007"]
        frozen = lambda vmid: fs.read(f"/sys/fs/cgroup/qemu.slice/{vmid}.scope/vcpu0/cgroup.freeze")
        assert sorted([frozen(8006), frozen(8007)]) == ["0", "1"]
        # vm8007 exits: one pass gives its directories back and forgets every entry of theirs
        mine = lambda: sorted(k for k, e in journal.entries.items() if "8007" in json.dumps(e))
        assert any('"freeze"' in json.dumps(journal.entries[k]) for k in mine()), mine()
        for pid in (200, 201, 202):                               # the process, and its threads at /proc/TID
            shutil.rmtree(tmp_path / f"proc/{pid}")
        reconcile(engine, build())
        assert mine() == [] and not (tmp_path / "sys/fs/cgroup/qemu.slice/8007.scope/vcpu0").exists()
    finally:
        assert engine.release() == []
    assert len(journal) == 0
    assert (tmp_path / "proc/101/cgroup").read_text() == "0::/qemu.slice/8006.scope\n"
    assert {str(p.relative_to(tmp_path)) for p in (tmp_path / "sys").rglob("*")} == scope_files


def test_qemu_s_own_vcpu_map_names_threads_that_have_no_vcpu_names(fake, fs):
    from cosched.discovery.qmp import QmpCache
    argv = PVE_ARGV[:4] + ["vm8006"] + PVE_ARGV[5:]                       # no debug-threads: no CPU n/KVM names
    fake.process(200, argv)
    fake.thread(200, 200, "kvm", "/qemu.slice/8006.scope")
    for tid in (201, 202):
        fake.thread(200, tid, "kvm", "/qemu.slice/8006.scope")
    asked = []

    def query(path):
        asked.append(path)
        return {0: 202, 1: 201}
    source = ProcessSource(fs, qmp=QmpCache(query), trust=fake.trust)
    for _ in range(3):
        snap = build_snapshot(fs, source.domains(), Presets.load([]), "none")
    assert [(v.index, v.tid) for v in snap.domains[0].vcpus] == [(0, 202), (1, 201)]
    assert asked == [str(fs.path("/proc/200/root/var/run/qemu-server/8006.qmp"))]   # once, until threads change
    fake.thread(200, 203, "kvm", "/qemu.slice/8006.scope")                          # a vCPU hot-plugged
    source.domains()
    assert len(asked) == 2
    # a socket that does not answer is not waited on at every resync
    now = [0.0]
    busy = QmpCache(lambda path: asked.append(path), clock=lambda: now[0])
    for _ in range(3):
        assert busy.get(200, "/q", frozenset({"1"})) is None
    now[0] = 61.0
    busy.get(200, "/q", frozenset({"1"}))
    assert len(asked) == 4


def test_the_vm_id_comes_from_paths_or_the_scope_where_qemu_has_no_id_option(fake, fs):
    argv = ["qemu-system-x86_64", "-name", "vm1,debug-threads=on",
            "-chardev", "socket,id=qmp,path=/var/run/qemu-server/105.qmp,server=on,wait=off",
            "-mon", "chardev=qmp,mode=control"]
    assert parse(argv).vmid == "105"
    assert parse(["qemu-system-x86_64", "-name", "vm2", "-pidfile", "/run/qemu-server/106.pid"]).vmid == "106"
    qemu_process(fake, 300, ["qemu-system-x86_64", "-name", "vm3"], {0: 301}, layout="/qemu.slice/107.scope")
    fake.write("/proc/300/cgroup", "0::/qemu.slice/107.scope\n")
    fake.write("/etc/pve/qemu-server/107.conf", "tags: cosched-relaxed\n")
    (facts,) = ProcessSource(fs, trust=fake.trust).domains()
    assert (facts.uuid, facts.tags) == ("qemu-107", ("cosched-relaxed",))


def fake_qmp(path, answers: dict, greeting=b'{"QMP": {"version": {}, "capabilities": []}}\n'):
    """A QMP server on ``path`` for one client: the greeting, then per
    command the lines in ``answers`` (an event first, as QEMU may send)."""
    import socket
    import threading
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)

    def serve():
        conn, _ = server.accept()
        with conn:
            conn.sendall(greeting)
            buf = b""
            while True:
                data = conn.recv(4096)
                if not data:
                    return
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    command = json.loads(line)["execute"]
                    conn.sendall(b'{"event": "RTC_CHANGE", "data": {}}\n' + answers[command])
    threading.Thread(target=serve, daemon=True).start()
    return server


def test_qemu_is_asked_over_qmp_with_the_standard_library(tmp_path):
    from cosched.discovery.qmp import vcpu_threads
    cpus = b'{"return": [{"cpu-index": 0, "thread-id": 4711}, {"cpu-index": 1, "thread-id": 4712}]}\n'
    with fake_qmp(tmp_path / "ok.qmp", {"qmp_capabilities": b'{"return": {}}\n', "query-cpus-fast": cpus}):
        assert vcpu_threads(str(tmp_path / "ok.qmp")) == {0: 4711, 1: 4712}
    refused = b'{"error": {"class": "CommandNotFound", "desc": "not here"}}\n'
    with fake_qmp(tmp_path / "err.qmp", {"qmp_capabilities": b'{"return": {}}\n', "query-cpus-fast": refused}):
        assert vcpu_threads(str(tmp_path / "err.qmp")) is None
    with fake_qmp(tmp_path / "mute.qmp", {}, greeting=b'{"QMP": {}'):     # never a whole line
        assert vcpu_threads(str(tmp_path / "mute.qmp"), timeout=0.2) is None
    assert vcpu_threads(str(tmp_path / "absent.qmp")) is None
