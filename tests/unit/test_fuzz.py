"""Fuzzed operator input: configuration files, preset files and annotations.

Each input is either accepted or refused with an error that names the
culprit (the key, parameter or attribute, and the file), and no other
exception escapes. The inputs are built from the real schema (every config
key, every preset's parameters, with values of every TOML type, in and out
of range) and mixed with arbitrary text.

Examples per test: ``COSCHED_FUZZ_EXAMPLES`` (300 by default; ``make soak``
runs 10,000 each).
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import fields
from pathlib import Path
from xml.sax.saxutils import quoteattr

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.support.soak import record

from cosched.annotation import AnnotationError, domain_policy
from cosched.compat import tomllib
from cosched.config import Config, ConfigError, load
from cosched.policy.params import KINDS as SCHEMA
from cosched.policy.presets import Presets

EXAMPLES = int(os.environ.get("COSCHED_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PRESETS = Presets.load([])
CONFIG_KEYS = [f.name for f in fields(Config)]
PARAMS = sorted({p.name for params in SCHEMA.values() for p in params})
KINDS = sorted(SCHEMA)

scalars = st.one_of(
    st.integers(-2**40, 2**40), st.sampled_from([0, 1, 2, 5, 50, 99, 100, 1000, 10001, -1]),
    st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
    st.text(max_size=12), st.sampled_from(["127.0.0.1:9641", "[::1]:0", "host:", "gang", "none,boost", ""]))
values = st.one_of(scalars, st.lists(scalars, max_size=4))
words = st.text("abcdefghijklmnopqrstuvwxyz_-", min_size=1, max_size=12)
xml_names = st.from_regex(r"[a-z_][a-z0-9_-]{0,11}", fullmatch=True)       # what an attribute can be called


def xml_text(v) -> str:
    """``v`` as text an XML attribute can hold (libvirt stores nothing else)."""
    return "".join(c for c in str(v) if c in "\t\n\r" or (c >= " " and c not in "\ufffe\uffff"
                                                           and not 0xD800 <= ord(c) <= 0xDFFF))


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)            # a JSON string is a TOML basic string
    return "[" + ", ".join(toml_value(x) for x in v) + "]"


def toml(doc: dict) -> str:
    return "".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in doc.items())


def written(text: str, suffix: str = ".toml") -> str:
    fd, path = tempfile.mkstemp(suffix=suffix)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


@FUZZ
@given(st.dictionaries(st.one_of(st.sampled_from(CONFIG_KEYS), words), values, max_size=6),
       st.one_of(st.just(""), st.text(max_size=40)))
def test_a_config_file_is_valid_or_names_its_culprit(doc, noise):
    text = toml(doc) + noise
    path = written(text)
    try:
        config = load(path)
    except ConfigError as e:
        event("refused")
        record("fuzzed configuration files", cycles=1, faults=1)
        message = str(e)
        assert message.startswith(f"{path}: "), message
        # a file that parses names the key at fault (the noise may have added it); one that does not, where it broke
        try:
            keys = set(tomllib.loads(text))
        except tomllib.TOMLDecodeError:
            assert "(at " in message, message
        else:
            assert keys and any(repr(k) in message or f"{k}:" in message for k in keys), message
    else:
        event("accepted")
        record("fuzzed configuration files", cycles=1)
        assert isinstance(config, Config) and set(doc) <= set(CONFIG_KEYS)
    finally:
        os.unlink(path)


@FUZZ
@given(st.sampled_from(KINDS + ["", "gangg", "GANG"]),
       st.dictionaries(st.one_of(st.sampled_from(PARAMS), words), values, max_size=5),
       st.dictionaries(st.sampled_from(["policy", "description", "parameters", "extra"]), values, max_size=2))
def test_a_preset_file_loads_or_is_reported_by_name(kind, params, top):
    with tempfile.TemporaryDirectory() as d:
        text = f"policy = {json.dumps(kind)}\n" + toml(top) + "[parameters]\n" + toml(params)
        Path(d, "fuzzed.toml").write_text(text)
        presets = Presets.load([d])
        if "fuzzed" in presets.by_name and not presets.errors:
            event("accepted")
            record("fuzzed preset files", cycles=1)
            assert presets.by_name["fuzzed"].kind == kind
        else:
            event("refused")
            record("fuzzed preset files", cycles=1, faults=1)
            assert len(presets.errors) == 1 and "fuzzed.toml" in presets.errors[0], presets.errors
            assert "fuzzed" not in presets.by_name


@FUZZ
@given(st.sampled_from(sorted(PRESETS.by_name) + ["", "nope"]),
       st.dictionaries(st.one_of(st.sampled_from(PARAMS), xml_names), scalars.map(xml_text), max_size=4))
def test_an_annotation_is_valid_or_names_its_attribute(name, attrs):
    body = " ".join(f"{k}={quoteattr(v)}" for k, v in {"name": name, **attrs}.items())
    xml = ("<domain type='kvm'><name>vm</name><metadata>"
           f'<cosched:policy xmlns:cosched="urn:cosched:libvirt:1" {body}/></metadata></domain>')
    try:
        spec = domain_policy(xml, PRESETS, "none")
    except AnnotationError as e:
        event("refused")
        record("fuzzed annotations", cycles=1, faults=1)
        assert e.attribute in {"name", *attrs}, (e.attribute, attrs)
        assert e.attribute in str(e)
    else:
        event("accepted")
        record("fuzzed annotations", cycles=1)
        assert spec.preset == name and set(dict(spec.params)) >= set(attrs)


@FUZZ
@given(st.text(max_size=300), st.sampled_from(["", "<metadata>", "<cosched:policy xmlns:cosched=\"urn:cosched:libvirt:1\""]))
def test_arbitrary_domain_xml_never_raises_anything_else(text, prefix):
    try:
        domain_policy(f"<domain>{prefix}{text}", PRESETS, "none")
        record("arbitrary domain XML", cycles=1)
    except AnnotationError as e:
        record("arbitrary domain XML", cycles=1, faults=1)
        assert e.attribute
