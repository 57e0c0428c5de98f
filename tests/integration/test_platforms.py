"""OpenStack and KubeVirt end to end: real guests whose policy comes from what
nova writes into the domain XML, or from a VMI annotation passed through the
KubeVirt hook sidecar, managed by a real daemon and judged from outside.

(The Proxmox path has its own test: ``test_proxmox.py``.)
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import grpc

from cosched import kubevirt
from testbed import guests

from .conftest import PREFIX, DaemonProcess
from .test_enforce import wait_gang, watch_from_outside

NOVA = (Path(__file__).parents[1] / "support" / "data" / "nova-instance.xml").read_text()


def nova_metadata(flavor: str, extra_spec: str | None = None) -> str:
    """The ``<nova:instance>`` element of nova's real metadata shape, for ``flavor``."""
    element = re.search(r"<nova:instance .*</nova:instance>", NOVA, re.S).group(0).replace(
        'name="hpc.large"', f'name="{flavor}"')
    if extra_spec is not None:
        element = element.replace("</nova:extraSpecs>",
                                  f'<nova:extraSpec name="cosched:policy">{extra_spec}</nova:extraSpec>'
                                  "</nova:extraSpecs>")
    return element


def managed_in_turns(tmp_path, names: list[str], extra_config: str = "") -> dict[str, dict]:
    """Start a daemon, wait until ``names`` rotate in one gang cell, check from
    outside that each is frozen in turn, stop it; the guests' status entries."""
    daemon = DaemonProcess(tmp_path, extra_config=extra_config).start()
    try:
        wait_gang(daemon, names, switches=10, timeout=30)
        seen = watch_from_outside(2.0, names)
        assert set(seen) == {"samples", *names}, f"vCPU cgroups not found: {seen}"
        assert all(seen[n]["frozen"] for n in names), f"a guest never frozen in its gang: {seen}"
        return {n: daemon.domain(n) for n in names}
    finally:
        assert daemon.stop() == 0, daemon.log.read_text()


def test_nova_instances_get_their_flavor_s_policy(tmp_path, start_guest):
    start_guest("nova-rule", policy=nova_metadata("hpc.large"))                  # a config rule picks gang
    start_guest("nova-spec", policy=nova_metadata("m1.small", "gang quantum-ms=40"))   # the flavor's extra spec
    names = [PREFIX + "nova-rule", PREFIX + "nova-spec"]
    doms = managed_in_turns(tmp_path, names, 'flavor_policies = [{flavor = "hpc.*", policy = "gang"}]\n')
    rule, spec = doms[names[0]], doms[names[1]]
    assert (rule["policy"], rule["policy_source"], rule["managed"]) == ("gang", "flavor", True)
    assert (spec["policy"], spec["policy_source"], spec["managed"]) == ("gang", "extra-spec", True)
    assert spec["params"]["quantum-ms"] == 40 and rule["params"]["quantum-ms"] == 50


def test_a_vmi_annotated_for_gang_passes_the_sidecar_and_is_managed(tmp_path, libvirtd, guest_image):
    path = str(tmp_path / "kubevirt-hooks" / "cosched.sock")
    server = kubevirt.serve(path)
    channel = grpc.insecure_channel(f"unix:{path}")
    try:
        names = [PREFIX + "vmi-a", PREFIX + "vmi-b"]
        for name in names:
            # the domain virt-launcher would define, here one this host can boot, through the sidecar
            domain = guests.domain_xml(name, image=guest_image).encode()
            vmi = json.dumps({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                              "metadata": {"name": name, "namespace": "default",
                                           "annotations": {"cosched.io/policy": "gang",
                                                           "cosched.io/quantum-ms": "30"}}}).encode()
            call = channel.unary_unary("/kubevirt.hooks.v1alpha3.Callbacks/OnDefineDomain",
                                       request_serializer=lambda b: b, response_deserializer=lambda b: b)
            result = kubevirt.decode(call(kubevirt._field(1, domain) + kubevirt._field(2, vmi), timeout=5))
            xml = result[1][0].decode()
            assert "cosched:policy" in xml and 'name="gang"' in xml
            guests.CONSOLE_DIR.mkdir(parents=True, exist_ok=True)
            guests.connection().createXML(xml, 0)
        doms = managed_in_turns(tmp_path, names)
        for name in names:
            assert (doms[name]["policy"], doms[name]["policy_source"], doms[name]["managed"]) == (
                "gang", "annotation", True)
            assert doms[name]["params"]["quantum-ms"] == 30
    finally:
        channel.close()
        server.stop(grace=None)
        guests.destroy_all(PREFIX + "vmi-")
