"""OpenStack: policy per flavor, from what nova writes into the domain XML."""
from pathlib import Path

import pytest

from cosched.annotation import AnnotationError, domain_policy
from cosched.config import ConfigError, from_dict
from cosched.policy.presets import Presets

NOVA = (Path(__file__).resolve().parents[1] / "support" / "data" / "nova-instance.xml").read_text()
PRESETS = Presets.load([])
RULES = (("hpc.*", "gang"), ("*", "auto"))


def with_spec(value: str) -> str:
    return NOVA.replace('<nova:extraSpec name="hw_rng:allowed">True</nova:extraSpec>',
                        f'<nova:extraSpec name="hw_rng:allowed">True</nova:extraSpec>'
                        f'<nova:extraSpec name="cosched:policy">{value}</nova:extraSpec>')


def test_a_flavor_rule_selects_the_preset_of_an_instance_without_an_annotation():
    spec = domain_policy(NOVA, PRESETS, "none", RULES)
    assert (spec.preset, spec.source) == ("gang", "flavor")
    assert domain_policy(NOVA.replace('name="hpc.large"', 'name="m1.small"'), PRESETS, "none", RULES).preset == "auto"
    assert domain_policy(NOVA, PRESETS, "none").preset == "none"                 # no rules: the default


def test_the_flavor_extra_spec_wins_over_rules_and_an_annotation_over_both():
    spec = domain_policy(with_spec("relaxed costop-ms=4"), PRESETS, "none", RULES)
    assert (spec.preset, spec.source, dict(spec.params)["costop-ms"]) == ("relaxed", "extra-spec", 4)
    annotated = with_spec("relaxed").replace(
        "</metadata>", '<cosched:policy xmlns:cosched="urn:cosched:libvirt:1" name="boost"/></metadata>')
    assert domain_policy(annotated, PRESETS, "none", RULES).preset == "boost"


def test_older_nova_metadata_without_extra_specs_still_matches_rules():
    old = NOVA.replace("nova/1.1", "nova/1.0")
    old = old[:old.index("<nova:extraSpecs>")] + old[old.index("</nova:extraSpecs>") + len("</nova:extraSpecs>"):]
    assert domain_policy(old, PRESETS, "none", RULES).preset == "gang"


@pytest.mark.parametrize("value,culprit", [("fast", "unknown preset"), ("gang quantum-ms", "not param=value"),
                                           ("gang quantum-ms=0", "quantum-ms")])
def test_a_bad_extra_spec_names_itself(value, culprit):
    with pytest.raises(AnnotationError, match=culprit) as e:
        domain_policy(with_spec(value), PRESETS, "none", RULES)
    assert e.value.attribute == "cosched:policy"


def test_flavor_rules_are_validated_in_the_configuration():
    assert from_dict({"flavor_policies": [{"flavor": "hpc.*", "policy": "gang"}]}).flavor_policies == (("hpc.*", "gang"),)
    for bad in (["gang"], [{"flavor": "x"}], [{"flavor": "x", "policy": "gang", "extra": 1}], "gang"):
        with pytest.raises(ConfigError, match="flavor_policies"):
            from_dict({"flavor_policies": bad})
