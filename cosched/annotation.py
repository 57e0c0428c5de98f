"""What a guest asks for: the libvirt annotation, or a Proxmox VE tag. Parsed in one place.

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
The status file a private libvirtd keeps of a running guest (a
``<domstatus>`` around the ``<domain>``) carries the same annotation.

OpenStack nova rewrites an instance's domain XML (on every hard reboot, a
resize, a migration), so an annotation added by hand does not last. Policy
follows the flavor instead, from what nova itself writes into the XML
(``<nova:instance><nova:flavor name=...>``): the flavor's extra spec
``cosched:policy`` (a preset, then ``param=value`` words: ``openstack
flavor set hpc.large --property cosched:policy='gang quantum-ms=20'``),
which nova copies into the XML from metadata namespace 1.1 on; else the
first ``flavor_policies`` rule of the configuration whose glob matches the
flavor's name; else the default. An annotation still wins over both.

Proxmox VE guests are not libvirt domains: they ask with a tag in their
configuration (``tags: cosched-gang`` in ``/etc/pve/qemu-server/VMID.conf``,
set with ``qm set VMID --tags cosched-gang``). The grammar::

    cosched-<preset>[-<alias><value>]...

The longest run of words naming a preset selects it (so a site preset may
have dashes in its name); each following word sets one parameter, by a
one-letter alias (:data:`TAG_ALIASES`: ``q`` quantum-ms, ``w`` weight, ``p``
priority, ``b`` boost-ms, ``r`` pause-ms, ``s`` costop-ms, ``t`` costart-ms,
``d`` dwell-s)
and an integer, or is ``boost`` / ``noboost``. ``cosched-gang-q20-w2``:
gang, 20 ms quanta, weight 2. ``auto``'s ``allow`` cannot be written in a
tag (Proxmox's tags allow no commas). A guest may carry one ``cosched-``
tag; other tags are left alone.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from fnmatch import fnmatchcase

from cosched.model import PolicySpec
from cosched.policy.params import ParamError
from cosched.policy.presets import Presets

NAMESPACE = "urn:cosched:libvirt:1"
XML_PREFIX = "cosched"      # the namespace's prefix in domain XML (libvirt's metadata key)
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


def domain_policy(domain_xml: str, presets: Presets, default_preset: str,
                  flavors: tuple[tuple[str, str], ...] = ()) -> PolicySpec:
    """The policy of a domain (or of a ``<domstatus>``'s domain): its
    annotation; else, for an OpenStack instance, its flavor's ``cosched:policy``
    extra spec or the first of ``flavors`` (``(glob, preset)``) matching its
    flavor's name; else ``default_preset``."""
    root = parse_domain_xml(domain_xml)
    if root.tag == "domstatus":
        root = root.find("domain")
        if root is None:
            raise AnnotationError("xml", "a <domstatus> without a <domain>")
    element = find_annotation(root)
    if element is not None:
        return policy_from_element(element, presets)
    flavor = nova_flavor(root)
    if flavor is not None:
        name, specs = flavor
        if EXTRA_SPEC in specs:
            return extra_spec_policy(specs[EXTRA_SPEC], presets)
        for pattern, preset in flavors:
            if fnmatchcase(name, pattern):
                try:
                    return presets.spec(preset, {}, source="flavor")
                except ParamError as e:
                    raise AnnotationError("flavor_policies", f"flavor {name!r} matches {pattern!r}: {e}") from None
    return presets.spec(default_preset, {}, source="default")


# OpenStack: what nova writes into every instance's domain XML
NOVA_NAMESPACES = ("http://openstack.org/xmlns/libvirt/nova/1.1", "http://openstack.org/xmlns/libvirt/nova/1.0")
EXTRA_SPEC = "cosched:policy"


def nova_flavor(domain: ET.Element) -> tuple[str, dict[str, str]] | None:
    """``(flavor name, extra specs)`` from nova's ``<nova:instance>`` metadata
    (extra specs are there from namespace 1.1 on), None for another guest."""
    metadata = domain.find("metadata")
    for ns in NOVA_NAMESPACES:
        flavor = metadata.find(f"{{{ns}}}instance/{{{ns}}}flavor") if metadata is not None else None
        if flavor is not None:
            specs = {e.get("name", ""): (e.text or "").strip()
                     for e in flavor.findall(f"{{{ns}}}extraSpecs/{{{ns}}}extraSpec")}
            return flavor.get("name", ""), specs
    return None


def extra_spec_policy(value: str, presets: Presets) -> PolicySpec:
    """The ``cosched:policy`` flavor extra spec: a preset name, then
    ``param=value`` words (``gang quantum-ms=20``)."""
    name, *words = value.split()
    params = {}
    for word in words:
        key, sep, v = word.partition("=")
        if not sep:
            raise AnnotationError(EXTRA_SPEC, f"{word!r} is not param=value (in {value!r})")
        params[key] = v
    try:
        return presets.spec(name, params, source="extra-spec")
    except ParamError as e:
        raise AnnotationError(EXTRA_SPEC, f"{e} (in {value!r})") from None


TAG_PREFIX = "cosched-"
TAG_ALIASES = {"q": "quantum-ms", "w": "weight", "p": "priority", "b": "boost-ms", "r": "pause-ms", "s": "costop-ms",
               "t": "costart-ms", "d": "dwell-s"}


class TagError(AnnotationError):
    def __init__(self, tag: str, message: str):
        ValueError.__init__(self, f"tag {tag!r}: {message}")
        self.attribute = tag


def policy_tag(preset: str, params: dict[str, str]) -> str:
    """The tag that asks for ``preset`` with ``params`` (the grammar above);
    :class:`AnnotationError` for a parameter no tag can say."""
    by_param = {p: a for a, p in TAG_ALIASES.items()}
    words = [preset]
    for key, value in params.items():
        if key == "boost" and value.lower() in ("true", "false"):
            words.append("boost" if value.lower() == "true" else "noboost")
        elif key in by_param and value.isdigit():
            words.append(f"{by_param[key]}{value}")
        else:
            raise AnnotationError(key, f"a Proxmox tag cannot say {key}={value} (tags take "
                                       f"{', '.join(sorted(by_param))} as numbers, and boost)")
    return TAG_PREFIX + "-".join(words)


def tag_policy(tags, presets: Presets, default_preset: str) -> PolicySpec:
    """The policy a Proxmox VE guest's tags ask for (grammar above), else ``default_preset``."""
    ours = [t for t in tags if t.lower().startswith(TAG_PREFIX)]
    if not ours:
        return presets.spec(default_preset, {}, source="default")
    if len(ours) > 1:
        raise TagError(ours[1], f"a guest may carry one {TAG_PREFIX} tag, this one has {len(ours)}: {', '.join(ours)}")
    tag = ours[0]
    words = tag[len(TAG_PREFIX):].lower().split("-")
    known = set(presets.by_name)
    cut = next((n for n in range(len(words), 0, -1) if "-".join(words[:n]) in known), None)
    if cut is None:
        raise TagError(tag, f"names no preset (known: {', '.join(sorted(known))})")
    params: dict[str, object] = {}
    for word in words[cut:]:
        if word in ("boost", "noboost"):
            params["boost"] = "true" if word == "boost" else "false"
        elif word[:1] in TAG_ALIASES and word[1:].isdigit():
            params[TAG_ALIASES[word[0]]] = word[1:]
        else:
            raise TagError(tag, f"{word!r} is no parameter (an alias and a number, as q20, or boost/noboost; "
                                f"aliases: {', '.join(f'{a}={p}' for a, p in TAG_ALIASES.items())})")
    try:
        return presets.spec("-".join(words[:cut]), params, source="annotation")
    except ParamError as e:
        raise TagError(tag, str(e)) from None
