"""The example domains and configuration an operator starts from
(``vm-templates/examples``): each is valid, and each does what it says."""
from pathlib import Path

import pytest

from cosched.cli import main
from cosched.discovery.cputune import parse_cputune
from cosched.model import Domain, Host, Snapshot, Vcpu
from cosched.policy.plan import PlanConfig, plan
from cosched.policy.presets import Presets

EXAMPLES = Path(__file__).resolve().parents[2] / "vm-templates" / "examples"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.xml")), ids=lambda p: p.stem)
def test_every_example_domain_is_valid(path, tmp_path, capsys):
    config = tmp_path / "cosched.toml"
    config.write_text("presets_dirs = []\n")                  # the built-in presets only
    assert main(["validate", str(path), "--config", str(config)]) == 0, capsys.readouterr().err
    preset = path.stem.split("-")[0] if path.stem != "dedicated" else "gang"
    assert f"valid: preset {preset} " in capsys.readouterr().out


def test_the_presets_the_examples_name_all_exist():
    names = {p.stem.split("-")[0] for p in EXAMPLES.glob("*.xml")} - {"dedicated"}
    assert names == set(Presets.load([]).by_name)             # one example per preset


def test_the_flavor_rules_example_is_a_valid_configuration(tmp_path, capsys):
    config = tmp_path / "cosched.toml"
    config.write_text("presets_dirs = []\n" + (EXAMPLES / "nova-flavors.toml").read_text())
    assert main(["check-config", str(config)]) == 0, capsys.readouterr().err


def test_the_dedicated_example_is_left_alone_and_its_cpus_leave_the_pool():
    xml = (EXAMPLES / "dedicated.xml").read_text()
    host = Host(cpus=(0, 1, 2, 3), core_of={c: (0, c) for c in range(4)}, node_of={c: 0 for c in range(4)},
                cgroup="unified", cgroup2_mount="/sys/fs/cgroup")
    vcpus = tuple(Vcpu(i, 100 + i, f"/m/d/vcpu{i}") for i in range(2))
    spec = Presets.load([]).spec("gang", {}, "annotation")
    d = Domain("dedicated", "u-d", 1, vcpus, spec, cputune=parse_cputune(xml, 2))
    p = plan(Snapshot(host, (d,)), PlanConfig())
    assert p.left_alone["u-d"].startswith("dedicated CPUs") and p.pool == (0, 1)
