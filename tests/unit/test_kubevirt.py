"""The KubeVirt hook sidecar, called exactly as virt-launcher calls it."""
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import grpc
import pytest

from cosched import kubevirt
from cosched.annotation import domain_policy
from cosched.policy.presets import Presets

DATA = Path(__file__).resolve().parents[1] / "support" / "data"
DOMAIN = (DATA / "kubevirt-domain.xml").read_bytes()


def vmi(annotations: dict) -> bytes:
    """A VirtualMachineInstance as virt-launcher hands it over (JSON), trimmed to what matters."""
    return json.dumps({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "vmi-fedora", "namespace": "default", "uid": "6a1a24a1-4061-4607-8bf4-a3963d0c5895",
                     "annotations": {"hooks.kubevirt.io/hookSidecars": '[{"image": "cosched-kubevirt-hook:0.1"}]',
                                     "kubevirt.io/latest-observed-api-version": "v1", **annotations},
                     "labels": {"special": "vmi-fedora"}},
        "spec": {"domain": {"cpu": {"cores": 2}, "devices": {"disks": [{"disk": {"bus": "virtio"},
                                                                        "name": "containerdisk"}]},
                            "memory": {"guest": "2Gi"}},
                 "volumes": [{"containerDisk": {"image": "quay.io/containerdisks/fedora:40"},
                              "name": "containerdisk"}]}}).encode()


@pytest.fixture
def hook(tmp_path):
    path = str(tmp_path / "kubevirt-hooks" / "cosched.sock")
    server = kubevirt.serve(path)
    channel = grpc.insecure_channel(f"unix:{path}")
    yield channel
    channel.close()
    server.stop(grace=None)


def call(channel, method: str, request: bytes) -> bytes:
    return channel.unary_unary(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)(
        request, timeout=5)


def test_info_subscribes_on_define_domain_in_every_version(hook):
    info = kubevirt.decode(call(hook, "/kubevirt.hooks.info.Info/Info", b""))        # InfoParams{}
    assert info[1] == [b"cosched"]
    assert {v.decode() for v in info[4]} >= {"v1alpha1", "v1alpha2", "v1alpha3"}
    (point,) = info[3]
    assert kubevirt.decode(point)[1] == [b"OnDefineDomain"]


def test_on_define_domain_writes_the_vmi_s_policy_into_the_domain(hook):
    params = kubevirt._field(1, DOMAIN) + kubevirt._field(2, vmi({"cosched.io/policy": "gang",
                                                                  "cosched.io/quantum-ms": "20"}))
    for version in ("v1alpha2", "v1alpha3"):
        result = kubevirt.decode(call(hook, f"/kubevirt.hooks.{version}.Callbacks/OnDefineDomain", params))
        xml = result[1][0]
        spec = domain_policy(xml.decode(), Presets.load([]), "none")
        assert (spec.preset, spec.source, dict(spec.params)["quantum-ms"]) == ("gang", "annotation", 20)
        root = ET.fromstring(xml)
        assert root.find("metadata/{http://kubevirt.io}kubevirt/{http://kubevirt.io}uid") is not None   # kept
        assert len(root.findall("devices/disk")) == 1 and root.find("name").text == "default_vmi-fedora"


def test_a_vmi_without_a_policy_passes_through_and_a_second_call_replaces_not_adds(hook):
    untouched = kubevirt._field(1, DOMAIN) + kubevirt._field(2, vmi({}))
    assert kubevirt.decode(call(hook, "/kubevirt.hooks.v1alpha2.Callbacks/OnDefineDomain", untouched))[1] == [DOMAIN]
    once = kubevirt.annotate(DOMAIN, vmi({"cosched.io/policy": "relaxed"}))
    twice = kubevirt.annotate(once, vmi({"cosched.io/policy": "boost"}))
    policies = ET.fromstring(twice).findall("metadata/{urn:cosched:libvirt:1}policy")
    assert [p.get("name") for p in policies] == ["boost"]
