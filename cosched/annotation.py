"""The libvirt annotation that selects a guest's policy, parsed in one place.

In the domain XML::

    <metadata>
      <cosched:policy xmlns:cosched="urn:cosched:libvirt:1" name="gang" quantum-ms="50"/>
    </metadata>

``name`` selects a preset; every other attribute overrides one parameter of
that preset (dashes, as in the preset file). Set it on a running guest with::

    virsh metadata vm1 --uri urn:cosched:libvirt:1 --key cosched \\
        --set '<policy name="boost"/>' --live

Anything wrong (unknown attribute, bad value, unknown preset, two policy
elements, unparsable XML) raises :class:`AnnotationError` whose ``attribute``
names the culprit; the daemon then observes the guest without managing it.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET

from cosched.model import PolicySpec
from cosched.policy.params import ParamError
from cosched.policy.presets import Presets

NAMESPACE = "urn:cosched:libvirt:1"
ELEMENT = f"{{{NAMESPACE}}}policy"
MAX_XML_BYTES = 4 * 1024 * 1024


class AnnotationError(ValueError):
    def __init__(self, attribute: str, message: str):
        super().__init__(f"annotation attribute {attribute!r}: {message}")
        self.attribute = attribute


def parse_domain_xml(text: str) -> ET.Element:
    """Parse a domain XML document, refusing DTDs (libvirt never emits one)."""
    if len(text) > MAX_XML_BYTES:
        raise AnnotationError("xml", f"document larger than {MAX_XML_BYTES} bytes")
    if "<!DOCTYPE" in text or "<!ENTITY" in text:
        raise AnnotationError("xml", "DOCTYPE and ENTITY declarations are not allowed")
    try:
        return ET.fromstring(text)
    except ET.ParseError as e:
        raise AnnotationError("xml", f"not well-formed: {e}") from None


def find_annotation(domain: ET.Element) -> ET.Element | None:
    """The ``cosched:policy`` element of a ``<domain>``, or None."""
    metadata = domain.find("metadata")
    if metadata is None:
        return None
    ours = [el for el in metadata if isinstance(el.tag, str) and el.tag.startswith(f"{{{NAMESPACE}}}")]
    if not ours:
        return None
    if len(ours) > 1:
        raise AnnotationError("policy", f"{len(ours)} elements in {NAMESPACE}; exactly one <policy> allowed")
    (element,) = ours
    if element.tag != ELEMENT:
        local = element.tag.split("}", 1)[1]
        raise AnnotationError(local, f"unknown element <{local}> in {NAMESPACE} (expected <policy>)")
    return element


def policy_from_element(element: ET.Element, presets: Presets) -> PolicySpec:
    attrs = dict(element.attrib)
    for key in attrs:
        if key.startswith("{"):
            raise AnnotationError(key, "namespaced attributes are not allowed")
    name = attrs.pop("name", None)
    if name is None:
        raise AnnotationError("name", "missing (it selects the preset)")
    try:
        return presets.spec(name, attrs, source="annotation")
    except ParamError as e:
        raise AnnotationError(e.param, str(e).split(": ", 1)[1]) from None


def domain_policy(domain_xml: str, presets: Presets, default_preset: str) -> PolicySpec:
    """The policy of a domain: its annotation, else ``default_preset``."""
    element = find_annotation(parse_domain_xml(domain_xml))
    if element is None:
        return presets.spec(default_preset, {}, source="default")
    return policy_from_element(element, presets)
