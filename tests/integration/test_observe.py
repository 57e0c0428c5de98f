"""The daemon observes real guests on a real libvirtd."""
from __future__ import annotations

import os
import re
import subprocess
import sys

from cosched.hostfs import parse_cpu_list
from testbed import guests, services



def proc_vcpu_tids(pid: int) -> dict[int, int]:
    """vCPU index -> TID, read independently from /proc's thread names."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        comm = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
        m = re.match(r"CPU (\d+)/(KVM|TCG)$", comm)
        if m:
            out[int(m.group(1))] = int(tid)
    return out


def test_discovered_tids_equal_procs(daemon, start_guest):
    g = start_guest("tids", vcpus=3, workload="idle", policy=guests.annotation("none"))
    dom, _ = daemon.wait(lambda: (d := daemon.domain(g.name)) and len(d["vcpus"]) == 3 and d, 10, "3 vCPUs")
    expected = proc_vcpu_tids(dom["pid"])
    assert {v["index"]: v["tid"] for v in dom["vcpus"]} == expected
    assert dom["policy"] == "none" and dom["error"] is None
    assert all(v["sched"] == "other" and not v["frozen"] and v["cpus"] for v in dom["vcpus"])
    status = daemon.status()
    assert status["host"]["cgroup"] in ("unified", "hybrid")
    online = parse_cpu_list(open("/sys/devices/system/cpu/online").read())
    assert online and status["host"]["cpus"] == list(online)


def test_guest_larger_than_the_pool_is_rejected(daemon, start_guest):
    size = len(os.sched_getaffinity(0)) + 1
    g = start_guest("too-big", vcpus=size, workload="idle", policy=guests.annotation("gang"))
    dom, _ = daemon.wait(lambda: (d := daemon.domain(g.name)) and d["error"] and d, 10, "rejection")
    assert f"{size} vCPUs" in dom["error"] and not dom["managed"]
    assert f'cosched_domain_policy_error{{domain="{g.name}"}} 1.0' in daemon.metrics()
    assert not any(v["frozen"] for v in dom["vcpus"])
    assert re.search(rf"domain={g.name} action=rejected", daemon.log.read_text())


def test_auto_runs_a_guest_larger_than_the_pool_under_a_mode_it_fits(daemon, start_guest):
    """auto chooses gang for a busy guest with more vCPUs than the pool has
    CPUs; gang cannot take it, so it runs under boost, managed, not rejected."""
    size = len(os.sched_getaffinity(0)) + 1
    g = start_guest("auto-big", vcpus=size, workload="barrier", policy=guests.annotation("auto"))
    dom, _ = daemon.wait(lambda: (d := daemon.domain(g.name)) and d["mode"] not in (None, "none") and d, 30,
                         "auto's choice")
    assert dom["mode"] == "boost" and dom["managed"] and dom["error"] is None, dom
    assert f'cosched_domain_mode{{domain="{g.name}",mode="boost"}} 1.0' in daemon.metrics()
    log = daemon.log.read_text()
    assert re.search(rf"domain={g.name} action=mode old=none new=boost reason='gang scores .*; the planner "
                     rf"cannot take gang \(not managed: it has {size} vCPUs", log), log
    assert not re.search(rf"domain={g.name} action=rejected", log), log
    explain = subprocess.run([sys.executable, "-m", "cosched", "explain", g.name, "--config", str(daemon.config)],
                             capture_output=True, text=True)
    assert explain.returncode == 0 and "mode boost" in explain.stdout, explain
    assert f"the planner cannot take gang: not managed: it has {size} vCPUs" in explain.stdout


def test_guest_appears_and_disappears_within_2s(daemon, start_guest):
    g = start_guest("appear", workload="idle")
    _, took = daemon.wait(lambda: daemon.domain(g.name), 2.0, "new guest in status")
    _, _ = daemon.wait(lambda: f'domain="{g.name}"' in daemon.metrics(), 2.0, "new guest in metrics")
    assert daemon.domain(g.name)["policy"] == "none"        # no annotation: default_policy
    g.destroy()
    daemon.wait(lambda: daemon.domain(g.name) is None, 2.0, "destroyed guest gone from status")
    assert f'domain="{g.name}"' not in daemon.metrics()


def test_invalid_annotation_reported_and_daemon_keeps_running(daemon, start_guest):
    g = start_guest("invalid", workload="idle", policy=guests.annotation("gang", quantum_ms="fast"))
    dom, _ = daemon.wait(lambda: (d := daemon.domain(g.name)) and d["error"] and d, 3, "error in status")
    assert "quantum-ms" in dom["error"] and dom["policy"] is None
    assert dom["vcpus"], "an invalid guest is still observed"
    assert f'cosched_domain_policy_error{{domain="{g.name}"}} 1.0' in daemon.metrics()
    log = daemon.log.read_text()
    assert re.search(rf"domain={g.name} action=policy-error .*quantum-ms", log), log
    assert daemon.proc.poll() is None


def test_live_metadata_change_within_2s(daemon, start_guest):
    g = start_guest("live", workload="idle", policy=guests.annotation("gang"))
    daemon.wait(lambda: (d := daemon.domain(g.name)) and d["policy"] == "gang", 3, "gang policy")
    subprocess.run(["virsh", "-c", "qemu:///system", "metadata", g.name, "--uri", "urn:cosched:libvirt:1",
                    "--key", "cosched", "--set", '<policy name="boost" boost-ms="7"/>', "--live"],
                   check=True, capture_output=True)
    dom, took = daemon.wait(lambda: (d := daemon.domain(g.name)) and d["policy"] == "boost" and d, 2.0, "boost policy")
    assert dom["params"]["boost-ms"] == 7
    subprocess.run(["virsh", "-c", "qemu:///system", "metadata", g.name, "--uri", "urn:cosched:libvirt:1",
                    "--key", "cosched", "--set", '<policy name="boost" boost-ms="0"/>', "--live"],
                   check=True, capture_output=True)
    daemon.wait(lambda: (d := daemon.domain(g.name)) and d["error"], 2.0, "error after a bad live change")
    assert f'cosched_domain_policy_error{{domain="{g.name}"}} 1.0' in daemon.metrics()


def test_libvirtd_restart_keeps_daemon_running_and_resyncs(daemon, start_guest):
    before = start_guest("restart-a", workload="idle")
    daemon.wait(lambda: daemon.domain(before.name), 3, "guest before restart")
    services.stop("libvirtd")
    daemon.wait(lambda: not daemon.status()["daemon"]["libvirt"]["connected"], 15, "daemon notices libvirtd gone")
    assert daemon.domain(before.name), "guests keep running and stay observed without libvirtd"
    services.ensure()
    daemon.wait(lambda: daemon.status()["daemon"]["libvirt"]["connected"], 15, "daemon reconnects")
    after = start_guest("restart-b", workload="idle")
    daemon.wait(lambda: daemon.domain(after.name), 3, "guest started after the restart")
    before.destroy()
    daemon.wait(lambda: daemon.domain(before.name) is None, 3, "guest destroyed after the restart")
    assert daemon.proc.poll() is None
    assert "action=connected" in daemon.log.read_text().split("action=disconnected", 1)[1]


def test_vcpu_hotplug_and_unplug_are_followed(daemon, start_guest):
    from cosched.actuators.journal import Journal
    g = start_guest("hotplug", vcpus=1, max_vcpus=2, workload="idle", policy=guests.annotation("gang"))
    g.wait_for("cosched-ready")
    dom, _ = daemon.wait(lambda: (d := daemon.domain(g.name)) and len(d["vcpus"]) == 1 and d, 5, "1 vCPU")
    subprocess.run(["virsh", "-c", "qemu:///system", "setvcpus", g.name, "2", "--live"], check=True, capture_output=True)
    # no libvirt event announces a vCPU hot-plug: the periodic resync (5 s) finds it
    dom, _ = daemon.wait(lambda: (d := daemon.domain(g.name)) and len(d["vcpus"]) == 2 and d, 8, "2 vCPUs")
    assert {v["index"]: v["tid"] for v in dom["vcpus"]} == proc_vcpu_tids(dom["pid"])
    assert dom["managed"] and dom["error"] is None
    gone = next(v["tid"] for v in dom["vcpus"] if v["index"] == 1)
    journal = f"{daemon.state_dir}/journal.json"
    daemon.wait(lambda: any(e.get("tid") == gone for e in Journal(journal).entries.values()), 5,
                "the plugged vCPU managed (its thread's attributes on record)")
    # unplug: the guest's kernel ejects the vCPU and QEMU ends its thread; a TCG guest takes
    # about libvirt's own 5 s wait for that, so virsh may report a time-out for an unplug that happens
    subprocess.run(["virsh", "-c", "qemu:///system", "setvcpus", g.name, "1", "--live"], capture_output=True)
    daemon.wait(lambda: len(proc_vcpu_tids(dom["pid"])) == 1, 30, "the guest let the vCPU go")
    dom, _ = daemon.wait(lambda: (d := daemon.domain(g.name)) and len(d["vcpus"]) == 1 and d, 10, "back to 1 vCPU")
    assert proc_vcpu_tids(dom["pid"]) == {0: dom["vcpus"][0]["tid"]}
    assert dom["managed"] and dom["error"] is None
    daemon.wait(lambda: not any(e.get("tid") == gone for e in Journal(journal).entries.values()), 8,
                "nothing of the unplugged vCPU on record")
    assert daemon.proc.poll() is None

