import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cosched.cli import main
from cosched.render import render

ROOT = Path(__file__).resolve().parents[2]


def xml(tmp_path, policy):
    p = tmp_path / "vm.xml"
    p.write_text(f"<domain type='kvm'><name>vm</name><metadata>{policy}</metadata></domain>")
    return str(p)


def test_validate_valid(tmp_path, capsys):
    f = xml(tmp_path, '<cosched:policy xmlns:cosched="urn:cosched:libvirt:1" name="gang" quantum-ms="20"/>')
    assert main(["validate", f]) == 0
    assert "preset gang" in capsys.readouterr().out


def test_validate_names_bad_attribute(tmp_path, capsys):
    f = xml(tmp_path, '<cosched:policy xmlns:cosched="urn:cosched:libvirt:1" name="gang" quantum-ms="abc"/>')
    assert main(["validate", f]) == 1
    assert "'quantum-ms'" in capsys.readouterr().err


def test_validate_every_template_and_missing_file(tmp_path, capsys):
    from string import Template

    from testbed.guests import TEMPLATES, annotation
    templates = sorted(TEMPLATES.glob("*.xml"))
    assert templates, f"no templates in {TEMPLATES}"
    for path in templates:
        for policy, code in ((annotation("gang", quantum_ms=20), 0), (annotation("gang", quantum_ms="x"), 1)):
            xml = Template(path.read_text()).substitute(
                name="vm", type="qemu", vcpus=2, max_vcpus=2, memory_mib=96, kernel="/k", initrd="/i",
                console_log="/c", workload="idle", annotation=policy, cputune="")
            rendered = tmp_path / path.name
            rendered.write_text(xml)
            assert main(["validate", str(rendered)]) == code, (path.name, policy)
        out = capsys.readouterr()
        assert "valid: preset gang (policy gang" in out.out and "quantum-ms" in out.err, (path.name, out)
    assert main(["validate", str(tmp_path / "none.xml")]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_check_config(tmp_path, capsys):
    good = tmp_path / "good.toml"
    good.write_text('default_policy = "boost"\n')
    assert main(["check-config", str(good)]) == 0
    bad = tmp_path / "bad.toml"
    bad.write_text('default_policy = "turbo"\n')
    assert main(["check-config", str(bad)]) == 1
    assert "turbo" in capsys.readouterr().err
    typo = tmp_path / "typo.toml"
    typo.write_text('sample_intervl_ms = 5\n')
    assert main(["check-config", str(typo)]) == 1
    assert "sample_intervl_ms" in capsys.readouterr().err


def test_status_without_daemon(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'state_dir = "{tmp_path}"\n')
    assert main(["status", "--config", str(cfg)]) == 3                    # systemctl's "not running"
    assert "no daemon" in capsys.readouterr().err


def test_explain_without_daemon(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'state_dir = "{tmp_path}"\n')
    assert main(["explain", "vm1", "--config", str(cfg)]) == 3
    assert "no daemon" in capsys.readouterr().err


def test_render_with_rates():
    def doc(observed, run, hazard):
        return {"host": {"cpus": [0, 1], "cgroup": "hybrid"},
                "daemon": {"version": "x", "dry_run": False, "libvirt": {"uri": "qemu:///system", "connected": True}},
                "domains": [{"name": "vm1", "uuid": "u", "policy": None, "error": "annotation attribute 'x': bad",
                             "observed_seconds": observed, "hazard_seconds": hazard, "skew_mean_seconds": 0.001,
                             "vcpus": [{"index": 0, "tid": 5, "cpus": [0], "sched": "other", "frozen": False,
                                        "run_seconds": run, "wait_seconds": 0.0}]}]}
    text = render(doc(2.0, 1.0, 0.5), doc(1.0, 0.5, 0.0))
    assert "INVALID" in text and "50.0" in text and "error: annotation attribute 'x'" in text


def test_wheel_has_package_presets_and_script(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True)
    (wheel,) = tmp_path.glob("cosched-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "cosched/cli.py" in names
    for preset in ("none", "gang", "partial", "boost", "relaxed", "auto"):
        assert f"cosched/policies/{preset}.toml" in names
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "cosched = cosched.entry:main" in zipfile.ZipFile(wheel).read(entry).decode()
    assert any(n.endswith(".dist-info/LICENSE") or "licenses/LICENSE" in n for n in names)
    # installed under any prefix, the package finds its own presets
    prefix = tmp_path / "prefix"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed",
                    "--prefix", str(prefix), str(wheel)],
                   check=True, capture_output=True)
    (site,) = prefix.glob("lib/python3*/site-packages")
    config = tmp_path / "cosched.toml"
    config.write_text('presets_dirs = []\ndefault_policy = "gang"\n')
    r = subprocess.run([sys.executable, "-c", "import sys, cosched, cosched.cli; print(cosched.__file__); "
                        "sys.exit(cosched.cli.main(['check-config', sys.argv[1]]))", str(config)],
                       capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ["PYTHONPATH"]])})
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith(str(site)) and "gang" in r.stdout, r.stdout


def test_status_as_a_user_who_may_not_ask_says_permission_denied():
    """A running daemon's socket (0600 in a 0700 directory) asked by an unprivileged user."""
    import os
    import shutil
    import tempfile
    from pathlib import Path

    from cosched.cli import main
    from cosched.control import ControlServer

    tmp_path = Path(tempfile.mkdtemp(prefix="cosched-test-"))     # readable by all, as /etc/cosched is

    state = tmp_path / "state"
    server = ControlServer(str(state / "cosched.sock"), lambda what: {"ok": True})
    server.start()
    server.serve()
    config = tmp_path / "cosched.toml"
    config.write_text(f'state_dir = "{state}"\n')
    os.chmod(tmp_path, 0o755)
    err = tmp_path / "err"
    try:
        pid = os.fork()
        if pid == 0:                                        # the child: nobody, then cosched status
            code = 2
            try:
                fd = os.open(err, os.O_WRONLY | os.O_CREAT, 0o666)
                os.setgroups([])
                os.setresgid(65534, 65534, 65534)
                os.setresuid(65534, 65534, 65534)
                sys.stderr = os.fdopen(fd, "w")
                code = main(["status", "--config", str(config)])
            finally:
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
    finally:
        server.stop()
    text = err.read_text()
    shutil.rmtree(tmp_path)
    assert os.waitstatus_to_exitcode(status) == 4, text                # systemctl's "permission denied"
    assert "permission denied" in text and "no daemon" not in text, text


def test_reset_restores_what_a_damaged_journal_still_holds_and_names_the_rest(tmp_path, capsys):
    from cosched.actuators import journal as jr
    from cosched.actuators.freezer import FreezerKnob
    from cosched.cli import main
    from cosched.hostfs import HostFS

    files = [tmp_path / f"cg{i}" / "cgroup.freeze" for i in range(2)]
    for f in files:
        f.parent.mkdir()
        f.write_text("0")
    state = tmp_path / "state"
    journal = jr.Journal(str(state / "journal.json"))
    knob = FreezerKnob(HostFS("/"))
    for i, f in enumerate(files):
        journal.record(knob.record(jr.Target(f"vm{i}", f"u{i}", 0, 7, 1007, freeze=str(f)), {}))
    for f in files:                                  # the daemon froze both, then died
        f.write_text("1")
    lines = (state / "journal.json").read_text().split("\n")
    lines[2] = lines[2][:-5] + "XXXXX"               # the second entry's line is damaged
    (state / "journal.json").write_text("\n".join(lines))
    config = tmp_path / "cosched.toml"
    config.write_text(f'state_dir = "{state}"\n')
    assert main(["reset", "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert "journal damaged" in err and "line 3: checksum mismatch" in err, err
    assert [f.read_text() for f in files] == ["0", "1"]           # the readable entry restored
    assert main(["reset", "--config", str(config)]) == 0          # nothing left that it knows of


def test_presets_are_listed_with_their_parameters_and_defaults(tmp_path, capsys):
    from cosched.cli import main
    site = tmp_path / "policies.d"
    site.mkdir()
    (site / "fast-gang.toml").write_text('policy = "gang"\ndescription = "short slots"\n[parameters]\nquantum-ms = 20\n')
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'presets_dirs = ["{site}"]\n')
    assert main(["presets", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "fast-gang: policy gang - short slots\n  boost=true priority=1 quantum-ms=20 weight=1" in out
    assert "auto: policy auto" in out and "allow=none,boost,relaxed,gang,partial" in out


def test_status_of_one_guest(tmp_path, capsys):
    from cosched.cli import main
    from cosched.control import ControlServer
    doc = {"host": {}, "daemon": {}, "domains": [{"name": "vm1", "x": 1}, {"name": "vm2", "x": 2}]}
    server = ControlServer(str(tmp_path / "state" / "cosched.sock"), lambda what: doc)
    server.start()
    server.serve()
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'state_dir = "{tmp_path / "state"}"\n')
    try:
        assert main(["status", "vm2", "--json", "--config", str(cfg)]) == 0
        assert json.loads(capsys.readouterr().out) == {"name": "vm2", "x": 2}
        assert main(["status", "vm3", "--config", str(cfg)]) == 1
        assert "no running guest named 'vm3'" in capsys.readouterr().err
    finally:
        server.stop()


def test_an_annotation_is_checked_before_it_is_written():
    from cosched.cli import _attributes
    assert _attributes("gang", ["quantum-ms=20"]) == 'name="gang" quantum-ms="20"'
    with pytest.raises(ValueError):
        _attributes("gang", ["quantum-ms"])


def test_a_proxmox_guest_s_policy_is_its_cosched_tag_and_the_other_tags_stay(tmp_path, capsys):
    from cosched.discovery.processes import with_tag
    pve = tmp_path / "qemu-server"
    pve.mkdir()
    conf = pve / "105.conf"
    conf.write_text("cores: 2\nname: web1\ntags: prod;cosched-gang-q30;web\n\n[snap1]\ntags: old\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'connect = "test:///default"\npve_config_dir = "{pve}"\n')
    assert main(["policy", "web1", "--config", str(cfg)]) == 0
    assert "cosched-gang-q30" in capsys.readouterr().out
    assert main(["policy", "105", "gang", "quantum-ms=20", "boost=false", "--config", str(cfg)]) == 0
    assert conf.read_text() == "cores: 2\nname: web1\ntags: prod;web;cosched-gang-q20-noboost\n\n[snap1]\ntags: old\n"
    assert main(["policy", "web1", "auto", "allow=none,gang", "--config", str(cfg)]) == 1   # no tag says that
    assert "cannot say allow" in capsys.readouterr().err
    assert main(["policy", "web1", "--clear", "--config", str(cfg)]) == 0
    assert conf.read_text() == "cores: 2\nname: web1\ntags: prod;web\n\n[snap1]\ntags: old\n"
    assert with_tag("cores: 2\n\n[s]\n", "cosched-gang") == "cores: 2\ntags: cosched-gang\n\n[s]\n"
    assert with_tag("tags: cosched-gang\n", None) == ""
