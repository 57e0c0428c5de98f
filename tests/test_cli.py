import subprocess
import sys
import zipfile
from pathlib import Path


from cosched.cli import main, render

ROOT = Path(__file__).resolve().parents[1]


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
    assert main(["status", "--config", str(cfg)]) == 1
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
    for preset in ("none", "gang", "partial", "boost"):
        assert any(n.endswith(f"data/share/cosched/policies/{preset}.toml") for n in names)
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "cosched = cosched.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()
