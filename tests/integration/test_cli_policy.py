"""``cosched policy`` against the real libvirtd: a guest's annotation shown,
set (checked first) and cleared, in its persistent definition and in the
running guest, as ``virsh metadata --live --config`` would."""
from __future__ import annotations

import subprocess
import sys

import libvirt
import pytest

from testbed import guests

from .conftest import PREFIX

DEFINED, RUNNING = PREFIX + "policy-defined", PREFIX + "policy-running"
URI = "urn:cosched:libvirt:1"


def cosched(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cosched", "policy", *args], capture_output=True, text=True)


def annotation(dom, flag) -> str | None:
    try:
        return dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, URI, flag)
    except libvirt.libvirtError:
        return None


@pytest.fixture
def pair(libvirtd, guest_image):
    conn = guests.connection()
    defined = conn.defineXML(guests.domain_xml(DEFINED, workload="idle", image=guest_image))
    running = guests.start(RUNNING, workload="idle", image=guest_image)
    yield defined, running.dom
    running.destroy()
    defined.undefine()


def test_a_policy_is_shown_set_checked_and_cleared(pair):
    defined, running = pair
    r = cosched(DEFINED)
    assert r.returncode == 0 and "no annotation" in r.stdout and "persistent definition" in r.stdout, r.stdout
    r = cosched(DEFINED, "gang", "quantum-ms=0")                     # refused before anything is written
    assert r.returncode == 1 and "quantum-ms" in r.stderr, r.stderr
    assert annotation(defined, libvirt.VIR_DOMAIN_AFFECT_CONFIG) is None
    r = cosched(DEFINED, "gang", "quantum-ms=20")
    assert r.returncode == 0 and "(persistent definition)" in r.stdout, r.stdout + r.stderr
    assert 'name="gang"' in annotation(defined, libvirt.VIR_DOMAIN_AFFECT_CONFIG)
    assert 'quantum-ms="20"' in cosched(DEFINED).stdout
    r = cosched(RUNNING, "auto", "allow=none,gang")
    assert r.returncode == 0 and "(running guest)" in r.stdout, r.stdout + r.stderr
    assert 'allow="none,gang"' in annotation(running, libvirt.VIR_DOMAIN_AFFECT_LIVE)
    for name, dom, flag in ((DEFINED, defined, libvirt.VIR_DOMAIN_AFFECT_CONFIG),
                            (RUNNING, running, libvirt.VIR_DOMAIN_AFFECT_LIVE)):
        r = cosched(name, "--clear")
        assert r.returncode == 0 and "cleared" in r.stdout, r.stdout + r.stderr
        assert annotation(dom, flag) is None
    r = cosched(PREFIX + "policy-nowhere")
    assert r.returncode == 1 and "policy-nowhere" in r.stderr
