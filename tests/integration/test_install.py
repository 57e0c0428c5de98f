"""``make install`` and ``make uninstall`` into a temporary root, for real.

Every destination of the Makefile is pointed under a temporary directory,
so the package gets its own virtualenv there, the unit, configuration,
dashboards and rules land where the unit and provisioning files say, and
uninstall takes them away again (keeping a configuration the operator
edited).
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def make(target: str, root: Path, *more: str) -> subprocess.CompletedProcess:
    dests = [f"PREFIX={root}/usr/local", f"LIBDIR={root}/opt/cosched", f"SYSCONFDIR={root}/etc/cosched",
             f"UNITDIR={root}/etc/systemd/system"]
    r = subprocess.run(["make", "-s", "-C", str(REPO), target, *dests, *more], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def test_install_then_uninstall(tmp_path):
    root = tmp_path / "root"
    make("install", root, "RUNBOOK_URL=https://runbook.example/cosched.html")
    cosched = root / "usr/local/bin/cosched"
    config = root / "etc/cosched/cosched.toml"
    unit = root / "etc/systemd/system/cosched.service"
    share = root / "usr/local/share/cosched"

    r = subprocess.run([str(cosched), "check-config", str(config)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr          # also finds the built-in presets in the venv
    text = unit.read_text()
    assert f"ExecStart={cosched} daemon --config {config}" in text
    assert f"ExecStopPost={cosched} reset --config {config}" in text
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True,
                       env={**os.environ, "MANPATH": str(root / "usr/local/share/man")})   # Documentation=man:
    assert r.returncode == 0 and "cosched.service" not in r.stderr, r.stderr
    assert sorted(p.name for p in (share / "grafana/dashboards").iterdir()) == ["cosched-fleet.json", "cosched-guest.json",
                                                                                    "cosched-host.json"]
    assert f"path: {share}/grafana/dashboards" in (share / "grafana/provisioning/dashboards/cosched.yaml").read_text()
    assert (share / "prometheus/cosched-alerts.yml").exists()
    assert (share / "prometheus/cosched-fleet-rules.yml").exists()
    assert (root / "usr/local/share/doc/cosched/README.md").exists()
    assert (root / "usr/local/share/doc/cosched/docs/fleet.md").exists()      # README links docs/...
    assert (root / "usr/local/share/man/man8/cosched.8").exists()
    assert (root / "usr/local/share/bash-completion/completions/cosched").exists()
    assert sorted(p.name for p in (root / "usr/local/share/doc/cosched/examples").iterdir()) == sorted(
        p.name for p in (REPO / "vm-templates/examples").iterdir())
    alerts = (share / "prometheus/cosched-alerts.yml").read_text()
    assert 'runbook_url: "https://runbook.example/cosched.html#coscheddown"' in alerts and "/runbook#" not in alerts
    assert (root / "usr/local/share/doc/cosched/docs/runbook.md").exists()
    # only what runs: libvirt's binding is Debian's (nothing compiled), no test or benchmark extras
    python = root / "opt/cosched/bin/python"
    r = subprocess.run([str(python), "-c", "import libvirt, prometheus_client; print(libvirt.__file__); "
                        "print(prometheus_client.__file__)"], capture_output=True, text=True)
    assert r.returncode == 0 and all(line.startswith("/usr/lib/python3/dist-packages/")
                                     for line in r.stdout.split()), r.stdout + r.stderr
    (site,) = (root / "opt/cosched/lib").glob("python3*/site-packages")
    listed = subprocess.run([str(python), "-m", "pip", "list", "--path", str(site)],
                            capture_output=True, text=True).stdout.lower()
    for absent in ("libvirt-python", "prometheus", "psutil", "qemu", "pytest", "hypothesis", "matplotlib"):
        assert absent not in listed, absent                 # nothing but cosched itself: the rest is Debian's
    r = subprocess.run([str(python), "-c", "from cosched import runbook; print(runbook.text())"],
                       capture_output=True, text=True)      # what the daemon serves at /runbook
    assert r.returncode == 0 and "## CoschedDown" in r.stdout, r.stderr

    config.write_text(config.read_text() + "reserved_cpus = [0]\n")     # the operator's own setting
    make("uninstall", root)
    for gone in (cosched, unit, share, root / "opt/cosched", root / "usr/local/share/doc/cosched",
                 root / "usr/local/share/man/man8/cosched.8", root / "usr/local/share/bash-completion/completions/cosched"):
        assert not gone.exists(), gone
    assert "reserved_cpus = [0]" in config.read_text()
