"""``make deb``: the Debian package, built with Debian's own tools, accepted
by lintian (``make deb`` fails on any lintian error), holding what an
operator needs and depending on Debian's archive alone.

Installing, upgrading, removing and purging it under systemd:
``test_service.py``."""
from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_make_deb_builds_a_package_lintian_accepts_with_everything_in_it():
    r = subprocess.run(["make", "-s", "-C", str(REPO), "deb"], capture_output=True, text=True)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    from cosched import __version__
    deb = REPO / "dist" / f"cosched_{__version__}_amd64.deb"
    files = set(subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True,
                               check=True).stdout.split())
    for path in ("./usr/bin/cosched", "./lib/systemd/system/cosched.service", "./etc/cosched/cosched.toml",
                 "./etc/cosched/policies.d/",
                 "./usr/lib/python3/dist-packages/cosched/sampler/meter.bpf.o",       # built at package time
                 "./usr/lib/python3/dist-packages/cosched/policies/gang.toml",
                 "./usr/share/cosched/prometheus/cosched-alerts.yml",
                 "./usr/share/cosched/grafana/dashboards/cosched-host.json",
                 "./usr/share/man/man8/cosched.8.gz", "./usr/share/bash-completion/completions/cosched",
                 "./usr/share/doc/cosched/examples/gang.xml", "./usr/share/doc/cosched/README.md.gz",
                 "./usr/share/doc/cosched/docs/runbook.md.gz",
                 "./usr/lib/python3/dist-packages/cosched/runbook.md"):            # what /runbook serves
        assert path in files, path
    field = lambda name: subprocess.run(["dpkg-deb", "-f", str(deb), name], capture_output=True, text=True,
                                        check=True).stdout.strip()
    depends = {d.strip().split()[0] for d in field("Depends").replace("|", ",").split(",")}
    assert {"python3-libvirt", "python3-prometheus-client", "libbpf1"} <= depends, depends
    control = subprocess.run(["dpkg-deb", "-I", str(deb), "conffiles"], capture_output=True, text=True).stdout
    assert control.split() == ["/etc/cosched/cosched.toml"]
    unit = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
    import io
    import tarfile
    with tarfile.open(fileobj=io.BytesIO(unit)) as tar:
        text = tar.extractfile("./lib/systemd/system/cosched.service").read().decode()
        rules = tar.extractfile("./usr/share/cosched/prometheus/cosched-alerts.yml").read().decode()
        served = tar.getmember("./usr/lib/python3/dist-packages/cosched/runbook.md")
        assert served.isfile() and b"## CoschedDown" in tar.extractfile(served).read()   # the file, not a link
    assert "ExecStart=/usr/bin/cosched daemon" in text and "/usr/local" not in text
    assert "/usr/local" not in rules and "http://{{ $labels.instance }}/runbook#coschedguestpolicyerror" in rules
