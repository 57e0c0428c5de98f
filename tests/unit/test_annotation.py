import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cosched.annotation import AnnotationError, domain_policy, parse_domain_xml
from cosched.policy.params import ParamError
from cosched.policy.presets import Presets

PRESETS = Presets.load([])


def dom(policy_xml: str) -> str:
    return f"<domain type='kvm'><name>vm</name><metadata>{policy_xml}</metadata></domain>"


def pol(attrs: str) -> str:
    return dom(f'<cosched:policy xmlns:cosched="urn:cosched:libvirt:1" {attrs}/>')


def test_preset_with_override():
    spec = domain_policy(pol('name="gang" quantum-ms="20" boost="false"'), PRESETS, "none")
    assert (spec.preset, spec.kind, spec.source) == ("gang", "gang", "annotation")
    assert dict(spec.params) == {"quantum-ms": 20, "boost": False, "priority": 1, "weight": 1}


def test_no_annotation_gives_default():
    spec = domain_policy(dom(""), PRESETS, "none")
    assert (spec.preset, spec.source) == ("none", "default")
    assert domain_policy("<domain><name>x</name></domain>", PRESETS, "boost").preset == "boost"


def test_other_namespaces_in_metadata_are_ignored():
    xml = dom('<app:x xmlns:app="urn:other"/><cosched:policy xmlns:cosched="urn:cosched:libvirt:1" name="boost"/>')
    assert domain_policy(xml, PRESETS, "none").preset == "boost"


@pytest.mark.parametrize("attrs,culprit", [
    ('name="gang" quantum-ms="0"', "quantum-ms"),
    ('name="gang" quantum-ms="5000"', "quantum-ms"),
    ('name="gang" quantum-ms="-5"', "quantum-ms"),
    ('name="gang" quantum-ms="1e3"', "quantum-ms"),
    ('name="gang" boost="maybe"', "boost"),
    ('name="gang" window-ms="20"', "window-ms"),     # a boost parameter on gang
    ('name="gang" colour="red"', "colour"),
    ('name="none" weight="2"', "weight"),
    ('name="turbo"', "name"),
    ('quantum-ms="20"', "name"),
    ('name="boost" priority="100"', "priority"),
])
def test_invalid_annotations_name_the_attribute(attrs, culprit):
    with pytest.raises(AnnotationError) as err:
        domain_policy(pol(attrs), PRESETS, "none")
    assert err.value.attribute == culprit
    assert culprit in str(err.value)


def test_two_policy_elements_rejected():
    one = '<cosched:policy xmlns:cosched="urn:cosched:libvirt:1" name="gang"/>'
    with pytest.raises(AnnotationError, match="exactly one"):
        domain_policy(dom(one + one.replace("gang", "boost")), PRESETS, "none")


def test_unknown_element_in_namespace_rejected():
    with pytest.raises(AnnotationError) as err:
        domain_policy(dom('<cosched:polcy xmlns:cosched="urn:cosched:libvirt:1" name="gang"/>'), PRESETS, "none")
    assert err.value.attribute == "polcy"


@pytest.mark.parametrize("text", [
    "<domain><metadata>",
    "",
    "not xml at all",
    '<?xml version="1.0"?><!DOCTYPE d [<!ENTITY a "aaaa"><!ENTITY b "&a;&a;&a;&a;">]><domain>&b;</domain>',
    '<!DOCTYPE d SYSTEM "file:///etc/passwd"><domain/>',
])
def test_malformed_and_hostile_xml(text):
    with pytest.raises(AnnotationError) as err:
        parse_domain_xml(text)
    assert err.value.attribute == "xml"


def test_unknown_default_preset_is_an_error():
    with pytest.raises(ParamError):
        domain_policy(dom(""), PRESETS, "nonexistent")


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["name", "quantum-ms", "boost", "priority", "weight", "window-ms", "x"]),
                       st.text(max_size=8), max_size=5))
def test_any_attribute_soup_is_valid_or_named_error(attrs):
    from xml.sax.saxutils import quoteattr
    body = " ".join(f"{k}={quoteattr(v)}" for k, v in attrs.items())
    try:
        spec = domain_policy(pol(body), PRESETS, "none")
    except AnnotationError as e:
        assert e.attribute in set(attrs) | {"name", "xml"}
    else:
        assert spec.preset == attrs["name"]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_never_escapes_as_other_exception(text):
    try:
        domain_policy(text, PRESETS, "none")
    except AnnotationError:
        pass
