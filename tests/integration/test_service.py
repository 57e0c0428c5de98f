"""The unit under a real systemd: a Debian 12 container booted by systemd-nspawn.

Inside it (:mod:`testbed.container`) run systemd 252 as PID 1, machined,
libvirtd and two TCG guests in systemd's ``machine.slice`` layout (each in
its machine scope, vCPU threads in ``libvirt/vcpuN``: see the container
module for what the test places itself and why). ``make install`` puts
cosched in place exactly as on a production host (Debian's libvirt binding,
no compiler), then the test drives the installed unit: ``Type=notify``
start-up, the sandbox (``ProtectSystem=strict``, the system call filter) with
real freezes, ``systemctl reload``, journald priorities, a SIGKILL followed by
``ExecStopPost=cosched reset`` and a restart, the watchdog, and a clean stop.

Then, in the same container with the same guests, the Debian package
(``make deb``) as operators use it: ``apt install`` of a previous build,
which enables and starts the service, managing the guests; an upgrade to
this build, which keeps the operator's configuration and restarts the
daemon; ``apt remove``, which stops it and leaves nothing frozen, pinned or
boosted; ``apt purge``, which takes the configuration and state away.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from testbed import container, guests
from testbed.image import GuestImage

REPO = Path(__file__).resolve().parents[2]
METER = REPO / "cosched/sampler/meter.bpf.o"
NAMES = ["cosched-it-svc-a", "cosched-it-svc-b"]


def copy_repo(dest: Path) -> None:
    """The project's files as git has them (a link as a link: the package's
    presets and runbook are links into the tree), and the in-kernel meter
    built here: the container has no compiler, as a production host that
    installs a package built elsewhere."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    assert METER.exists(), f"{METER} is not built (`make test` builds it: make meter)"
    for name in [*filter(None, files.decode().split("\0")), str(METER.relative_to(REPO))]:
        src = REPO / name
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            (dest / name).symlink_to(os.readlink(src))
        elif src.is_file():
            (dest / name).write_bytes(src.read_bytes())


@pytest.fixture(scope="module")
def box(tmp_path_factory, guest_image, libvirtd):
    tmp = tmp_path_factory.mktemp("systemd")
    src = tmp / "src"
    copy_repo(src)
    root = container.build_root()
    c = container.Container(root, src, guest_image.kernel.parent, container.wheelhouse(), tmp / "console.log")
    c.start()
    try:
        yield c
    finally:
        c.stop()


def sh(box, script: str, check: bool = True) -> str:
    return box.exec("sh", "-c", script, check=check).stdout


def cat(box, path: str) -> str:
    """A file inside the container (cgroup paths hold backslashes: no shell)."""
    return box.exec("cat", path, check=True).stdout


def show(box, *props: str) -> dict:
    out = sh(box, f"systemctl show cosched -p {','.join(props)}")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def wait(what: str, predicate, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.5)


def status(box) -> dict | None:
    r = box.exec("cosched", "status", "--json")
    return json.loads(r.stdout) if r.returncode == 0 else None


def rotating(box) -> dict | None:
    s = status(box)
    if not s:
        return None
    cells = s["daemon"]["engine"]["cells"]
    ok = cells and sorted(cells[0]["members"]) == NAMES and s["daemon"]["engine"]["switches"].get("gang", 0) >= 10
    return s if ok else None


def vcpu_cgroups(box) -> dict[str, list[str]]:
    """Each guest's vCPU cgroups, found from its threads' /proc/TID/cgroup inside the container."""
    out = {}
    for d in status(box)["domains"]:
        paths = []
        for v in d["vcpus"]:
            line = next(l for l in cat(box, f"/proc/{v['tid']}/cgroup").splitlines() if l.startswith("0::"))
            paths.append(line[3:])
        out[d["name"]] = paths
    assert all(out.get(n) for n in NAMES), out
    return out


def cgroup2(box) -> str:
    mount = sh(box, "findmnt -n -o TARGET -t cgroup2 | head -1").strip()
    assert mount, "no cgroup2 mount in the container"
    return mount


def leftovers(box, cgroups: dict[str, list[str]]) -> list[str]:
    """What the unit may have changed and left behind: frozen cgroups, threads
    not SCHED_OTHER, threads pinned to fewer CPUs than are online."""
    mount = cgroup2(box)
    online = cat(box, "/sys/devices/system/cpu/online").strip()
    left = []
    for name, paths in cgroups.items():
        for p in paths:
            if cat(box, f"{mount}{p}/cgroup.freeze").strip() != "0":
                left.append(f"{name} {p} frozen")
            for tid in cat(box, f"{mount}{p}/cgroup.threads").split():
                policy = box.exec("cat", f"/proc/{tid}/stat").stdout.rpartition(")")[2].split()[38:39]
                if policy != ["0"]:
                    left.append(f"{name} tid {tid} policy {policy}")
                allowed = re.search(r"Cpus_allowed_list:\s*(\S+)", cat(box, f"/proc/{tid}/status")).group(1)
                if allowed != online:
                    left.append(f"{name} tid {tid} pinned to {allowed}")
    return left


def test_the_unit_under_a_real_systemd(box, guest_image):
    # install as on a production host: Debian's libvirt binding, wheels for the rest, no compiler
    assert box.exec("sh", "-c", "command -v gcc").returncode != 0
    box.exec("env", "PIP_NO_INDEX=1", "PIP_FIND_LINKS=/wheels", "make", "-s", "-C", "/src", "install", check=True)
    assert "/usr/lib/python3/dist-packages/libvirt" in sh(box, "/opt/cosched/bin/python -c 'import libvirt; print(libvirt.__file__)'")
    # a broken site preset (a warning for journald), a fast watchdog for this test
    sh(box, "echo 'policy = 42' > /etc/cosched/policies.d/broken.toml && mkdir -p /etc/systemd/system/cosched.service.d && "
            "printf '[Service]\\nWatchdogSec=5s\\nTimeoutAbortSec=3s\\n' > /etc/systemd/system/cosched.service.d/test.conf && "
            "systemctl daemon-reload && systemctl start libvirtd.service")
    box.writable_controllers()
    # two gang guests inside
    image = GuestImage(Path("/image") / guest_image.kernel.name, Path("/image") / guest_image.initrd.name)
    for name in NAMES:
        xml = guests.domain_xml(name, workload="barrier", image=image, console_log=Path(f"/var/log/{name}.log"),
                                policy=guests.annotation("gang"))
        (box.src / f"{name}.xml").write_text(xml)
        box.exec("virsh", "-c", "qemu:///system", "create", f"/src/{name}.xml", check=True)
        box.split_vcpus(name)

    # Type=notify: start returns once the daemon said READY
    started = box.exec("systemctl", "start", "cosched")
    assert started.returncode == 0, sh(box, "journalctl -u cosched -o cat", check=False)
    props = show(box, "ActiveState", "SubState", "StatusText", "MainPID", "NRestarts")
    assert props["ActiveState"] == "active" and props["SubState"] == "running", props
    assert "guests observed" in props["StatusText"], props
    first_pid = props["MainPID"]

    # systemd starts services with a soft limit of 1,024 open files: the daemon raises its own to the hard limit
    limits = re.search(r"Max open files\s+(\d+)\s+(\d+)", cat(box, f"/proc/{first_pid}/limits"))
    assert limits and limits.group(1) == limits.group(2) and int(limits.group(1)) > 1024, limits
    assert "action=open-files-limit old=1024 " in sh(box, "journalctl -u cosched -o cat")

    # managed inside the sandbox: the gang rotates, vCPU cgroups in machine.slice
    s = wait("a gang of two rotating", lambda: rotating(box), 90)
    cgroups = vcpu_cgroups(box)
    for paths in cgroups.values():
        assert all(p.startswith("/machine.slice/") and re.search(r"/vcpu\d+$", p) for p in paths), cgroups
    mount = cgroup2(box)
    frozen_seen = set()
    for _ in range(40):
        for name, paths in cgroups.items():
            if "frozen 1" in cat(box, f"{mount}{paths[0]}/cgroup.events"):
                frozen_seen.add(name)
        time.sleep(0.05)
    assert frozen_seen == set(NAMES), f"both guests take turns being frozen: {frozen_seen}"
    assert s["daemon"]["preset_errors"], "the broken preset is reported"
    # as shipped the daemon counts with its in-kernel meter: the unit's sandbox lets it load
    assert s["daemon"]["observation"] == {"source": "meter", "why": None}, s["daemon"]["observation"]

    # reload keeps the same process and the rotation
    box.exec("systemctl", "reload", "cosched", check=True)
    wait("reloaded", lambda: "action=reloaded" in sh(box, "journalctl -u cosched -o cat"), 20)
    assert show(box, "MainPID")["MainPID"] == first_pid
    assert show(box, "ActiveState")["ActiveState"] == "active"

    # journald got each line's priority
    warnings = sh(box, "journalctl -u cosched -p warning -o cat")
    everything = sh(box, "journalctl -u cosched -o cat")
    assert "action=preset-invalid" in warnings and "action=started" not in warnings, warnings
    assert "action=started" in everything

    # SIGKILL: ExecStopPost=cosched reset, then Restart=on-failure
    box.exec("systemctl", "kill", "--kill-whom=main", "--signal=SIGKILL", "cosched", check=True)
    wait("restarted after SIGKILL", lambda: show(box, "NRestarts", "ActiveState") == {"NRestarts": "1", "ActiveState": "active"}, 60)
    assert "cosched reset: host restored" in sh(box, "journalctl -u cosched -o cat")
    wait("rotating again", lambda: rotating(box), 60)

    # the watchdog: a daemon that stops answering is killed and restarted
    pid = show(box, "MainPID")["MainPID"]
    box.exec("kill", "-STOP", pid, check=True)
    wait("restarted by the watchdog", lambda: show(box, "NRestarts")["NRestarts"] == "2", 60)
    assert "Watchdog timeout" in sh(box, "journalctl -u cosched -o cat")
    wait("rotating again", lambda: rotating(box), 60)

    # a clean stop leaves nothing frozen or boosted
    box.exec("systemctl", "stop", "cosched", check=True)
    assert show(box, "ActiveState")["ActiveState"] in ("inactive", "failed")
    assert leftovers(box, cgroups) == []
    score = re.search(r"Overall exposure level for cosched.service: ([0-9.]+)",
                      sh(box, "systemd-analyze security cosched.service --no-pager", check=False))
    assert score and float(score.group(1)) <= 3.5, score
    print(f"\nunder systemd: {props['StatusText']!r}; vCPU cgroups {cgroups}; frozen in turn: {sorted(frozen_seen)}; "
          f"security exposure {score.group(1)}")


def debs(dest: Path) -> tuple[Path, Path]:
    """This build's package (``make deb``), and the same repacked as the
    previous version, to upgrade from."""
    from cosched import __version__
    r = subprocess.run(["make", "-s", "-C", str(REPO), "deb"], capture_output=True, text=True)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    new = dest / "cosched-new.deb"
    new.write_bytes((REPO / "dist" / f"cosched_{__version__}_amd64.deb").read_bytes())
    tree = dest / "prev-tree"
    subprocess.run(["dpkg-deb", "-R", str(new), str(tree)], check=True)
    control = tree / "DEBIAN" / "control"
    control.write_text(re.sub(r"(?m)^Version: .*$", f"Version: {__version__}~prev", control.read_text()))
    prev = dest / "cosched-prev.deb"
    subprocess.run(["dpkg-deb", "-b", "--root-owner-group", str(tree), str(prev)], check=True, capture_output=True)
    return prev, new


def test_the_debian_package_installs_upgrades_removes_and_purges(box):
    # the first test's install goes: only the package is left to manage the guests
    box.exec("make", "-s", "-C", "/src", "uninstall", check=True)
    sh(box, "rm -rf /etc/cosched /etc/systemd/system/cosched.service.d && systemctl daemon-reload")
    prev, new = debs(box.src)
    apt = ("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-q")
    # the host's policy (policy-rc.d) says no service starts on install: enabled, not started
    sh(box, "printf '#!/bin/sh\\nexit 101\\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d")
    box.exec(*apt, "/src/cosched-prev.deb", check=True)            # Debian's archive has all it needs already
    assert sh(box, "systemctl is-enabled cosched").strip() == "enabled"
    assert show(box, "ActiveState")["ActiveState"] == "inactive"
    sh(box, "rm /usr/sbin/policy-rc.d && apt-get install -y -q --reinstall /src/cosched-prev.deb")
    wait("started once the host's policy allows, managing the gang", lambda: rotating(box), 90)
    cgroups = vcpu_cgroups(box)
    sh(box, "sed -i 's/^sample_interval_ms = 10$/sample_interval_ms = 20/' /etc/cosched/cosched.toml")
    before = show(box, "MainPID")["MainPID"]

    box.exec(*apt, "/src/cosched-new.deb", check=True)             # the upgrade
    assert "sample_interval_ms = 20" in cat(box, "/etc/cosched/cosched.toml")      # the operator's change kept
    wait("restarted by the upgrade", lambda: show(box, "MainPID", "ActiveState")["MainPID"] not in ("0", before)
         and show(box, "ActiveState")["ActiveState"] == "active", 60)
    s = wait("rotating after the upgrade", lambda: rotating(box), 90)
    assert s["daemon"]["version"] and sh(box, "dpkg-query -W -f='${Version}' cosched") == s["daemon"]["version"]

    box.exec("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "remove", "-y", "-q", "cosched", check=True)
    assert show(box, "ActiveState")["ActiveState"] in ("inactive", "failed")
    assert leftovers(box, cgroups) == []
    assert box.exec("test", "-e", "/etc/cosched/cosched.toml").returncode == 0       # a removal keeps the config

    box.exec("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "purge", "-y", "-q", "cosched", check=True)
    assert box.exec("test", "-e", "/etc/cosched").returncode != 0
    assert box.exec("test", "-e", "/run/cosched/journal.json").returncode != 0
    assert box.exec("test", "-e", "/usr/bin/cosched").returncode != 0
    assert leftovers(box, cgroups) == []
