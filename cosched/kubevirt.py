"""KubeVirt hook sidecar: a VMI's ``cosched.io/`` annotations become the domain's cosched annotation.

KubeVirt runs each VM in a pod whose ``virt-launcher`` starts a private
libvirtd and defines the domain. Before it does, it calls every hook sidecar
of the pod over gRPC (the ``hooks.kubevirt.io`` protocol): ``Info`` on the
sidecar's socket in ``/var/run/kubevirt-hooks/``, then, for the sidecars
subscribed to the ``OnDefineDomain`` hook point, ``OnDefineDomain`` with the
domain XML and the VMI (JSON); the sidecar answers with the domain XML to
define. This one adds, or replaces, the ``cosched:policy`` element in the
XML's ``<metadata>`` from the VMI's annotations::

    metadata:
      annotations:
        hooks.kubevirt.io/hookSidecars: '[{"image": "registry.example/cosched-kubevirt-hook:0.1"}]'
        cosched.io/policy: gang           # the preset
        cosched.io/quantum-ms: "20"       # any parameter of it, spelled as in the annotation

A VMI without ``cosched.io/policy`` passes through unchanged. The sidecar
does not judge the policy: an unknown preset or a bad parameter is written
as asked, and the cosched daemon on the node (which finds the pod's QEMU
process and reads this XML from the private libvirtd's status file, see
:mod:`cosched.discovery.processes`) reports it as it reports any invalid
annotation.

The sidecar speaks gRPC through ``grpcio`` (``pip install cosched[kubevirt]``),
with a generic handler and the four small protobuf messages of the protocol
encoded here (strings, bytes and an int32: no generated code, no protobuf
runtime). Its container build file is ``deploy/kubevirt/Containerfile``.

    cosched-kubevirt-hook [--socket /var/run/kubevirt-hooks/cosched.sock]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import xml.etree.ElementTree as ET

from cosched.annotation import ELEMENT, NAMESPACE, XML_PREFIX

log = logging.getLogger("cosched.kubevirt")

NAME = "cosched"
SOCKET = "/var/run/kubevirt-hooks/cosched.sock"
VERSIONS = ("v1alpha1", "v1alpha2", "v1alpha3")      # OnDefineDomain is the same message in each
PREFIX = "cosched.io/"
POLICY = PREFIX + "policy"


# -- the protocol's messages (protobuf wire format, proto3) ---------------------
def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, value: bytes | str | int) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    data = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def decode(data: bytes) -> dict[int, list]:
    """``{field number: [values]}`` of a message: length-delimited fields as
    bytes, varints as ints (other wire types are skipped)."""
    out: dict[int, list] = {}
    i = 0

    def varint() -> int:
        nonlocal i
        n = shift = 0
        while True:
            b = data[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return n
    while i < len(data):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            out.setdefault(number, []).append(varint())
        elif wire == 2:
            length = varint()
            out.setdefault(number, []).append(data[i:i + length])
            i += length
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"wire type {wire} of field {number} is not supported")
    return out


def info_result() -> bytes:
    """``InfoResult``: name 1, hookPoints 3 (``HookPoint``: name 1, priority 2), versions 4."""
    hook_point = _field(1, "OnDefineDomain") + _field(2, 0)
    return _field(1, NAME) + _field(3, hook_point) + b"".join(_field(4, v) for v in VERSIONS)


def on_define_domain(request: bytes) -> bytes:
    """``OnDefineDomainParams`` (domainXML 1, vmi 2) -> ``OnDefineDomainResult`` (domainXML 1)."""
    fields = decode(request)
    domain = (fields.get(1) or [b""])[0]
    vmi = (fields.get(2) or [b"{}"])[0]
    return _field(1, annotate(domain, vmi))


# -- what the sidecar does ---------------------------------------------------
def policy_attributes(vmi: dict) -> dict[str, str] | None:
    """The cosched annotation a VMI asks for (``name`` and parameters), None when it asks for none."""
    annotations = (vmi.get("metadata") or {}).get("annotations") or {}
    if POLICY not in annotations:
        return None
    attrs = {"name": str(annotations[POLICY])}
    for key, value in annotations.items():
        if key.startswith(PREFIX) and key != POLICY:
            attrs[key[len(PREFIX):]] = str(value)
    return attrs


def annotate(domain_xml: bytes, vmi_json: bytes) -> bytes:
    """The domain XML with the VMI's cosched annotation in its ``<metadata>``
    (an existing one replaced); unchanged when the VMI asks for none."""
    try:
        vmi = json.loads(vmi_json or b"{}")
    except ValueError as e:
        log.error("action=vmi-unreadable error=%r: domain passed through", str(e))
        return domain_xml
    attrs = policy_attributes(vmi)
    name = (vmi.get("metadata") or {}).get("name", "?")
    if attrs is None:
        return domain_xml
    ET.register_namespace(XML_PREFIX, NAMESPACE)
    root = ET.fromstring(domain_xml)
    metadata = root.find("metadata")
    if metadata is None:
        metadata = ET.Element("metadata")
        root.insert(0, metadata)
    for old in [el for el in metadata if el.tag == ELEMENT]:
        metadata.remove(old)
    ET.SubElement(metadata, ELEMENT, attrs)
    log.info("vmi=%s action=annotated %s", name, " ".join(f"{k}={v}" for k, v in attrs.items()))
    return ET.tostring(root)


# -- the server ----------------------------------------------------------------
def handler():
    """A ``grpc`` generic handler for ``Info`` and ``OnDefineDomain`` of every version."""
    import grpc

    ident = lambda b: b                                           # noqa: E731 (bytes in, bytes out)
    methods = {"/kubevirt.hooks.info.Info/Info": lambda request, context: info_result()}
    for version in VERSIONS:
        methods[f"/kubevirt.hooks.{version}.Callbacks/OnDefineDomain"] = (
            lambda request, context: on_define_domain(request))

    class Handler(grpc.GenericRpcHandler):
        def service(self, details):
            method = methods.get(details.method)
            if method is None:
                return None
            return grpc.unary_unary_rpc_method_handler(method, request_deserializer=ident,
                                                       response_serializer=ident)
    return Handler()


def serve(socket_path: str):
    """Start serving on ``socket_path`` (a stale socket file is replaced); returns the server."""
    import grpc
    from concurrent import futures

    os.makedirs(os.path.dirname(socket_path) or ".", exist_ok=True)
    if os.path.exists(socket_path):
        os.unlink(socket_path)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler(),))
    server.add_insecure_port(f"unix:{socket_path}")
    server.start()
    log.info("action=serving socket=%s versions=%s", socket_path, ",".join(VERSIONS))
    return server


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="cosched-kubevirt-hook", description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", default=SOCKET, help=f"where virt-launcher looks for hook sockets (default {SOCKET})")
    ap.add_argument("--version", help="accepted for KubeVirt's hookSidecars args; every version is served")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
    try:
        import grpc  # noqa: F401
    except ImportError:
        print("cosched-kubevirt-hook needs grpcio: pip install 'cosched[kubevirt]'", file=sys.stderr)
        return 1
    server = serve(args.socket)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
