"""The libvirt side of discovery: one connection, events, reconnect.

The libvirt event loop runs in its own thread. Domain lifecycle, metadata,
device and tunable events only wake the resync (``on_change``); the facts
themselves are always read afresh by :meth:`LibvirtSource.domains`, so a lost
or reordered event can delay a change (until the periodic resync) but never
corrupt the model. A keepalive (5 s x 3) notices a dead libvirtd; the close
callback marks the connection lost, and :meth:`LibvirtSource.ensure_connected`
reopens it with exponential backoff (0.5 s doubling to 10 s), after which the
caller does a full resync.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import libvirt

from cosched.discovery import DomainFacts

log = logging.getLogger("cosched.discovery")

# A domain that stopped or vanished while we talked to it: normal life, not an error.
DOMAIN_GONE = (libvirt.VIR_ERR_NO_DOMAIN, libvirt.VIR_ERR_OPERATION_INVALID)


def domain_gone(e: libvirt.libvirtError) -> bool:
    return e.get_error_code() in DOMAIN_GONE

_EVENTS = (
    "VIR_DOMAIN_EVENT_ID_LIFECYCLE",
    "VIR_DOMAIN_EVENT_ID_METADATA_CHANGE",
    "VIR_DOMAIN_EVENT_ID_DEVICE_ADDED",
    "VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED",
    "VIR_DOMAIN_EVENT_ID_TUNABLE",
)
_CLOSE_REASONS = {0: "error", 1: "eof", 2: "keepalive", 3: "client"}   # VIR_CONNECT_CLOSE_REASON_*
_loop_lock = threading.Lock()
_loop_started = False


def _silence_libvirt_stderr(_ctx, _err):
    """libvirt prints every error to stderr by default; we log our own."""


def start_event_loop() -> None:
    """Register libvirt's default event implementation and run it in a thread (once)."""
    global _loop_started
    with _loop_lock:
        if _loop_started:
            return
        libvirt.registerErrorHandler(_silence_libvirt_stderr, None)
        libvirt.virEventRegisterDefaultImpl()

        def run():
            while True:
                libvirt.virEventRunDefaultImpl()

        threading.Thread(target=run, name="libvirt-events", daemon=True).start()
        _loop_started = True


class LibvirtSource:
    def __init__(self, uri: str, on_change: Callable[[], None]):
        self.uri = uri
        self.on_change = on_change
        self.conn: libvirt.virConnect | None = None
        self._backoff = 0.5
        self._next_try = 0.0
        self._lost = threading.Event()
        self.last_error: str | None = None

    @property
    def connected(self) -> bool:
        return self.conn is not None and not self._lost.is_set()

    def live_conn(self) -> "libvirt.virConnect | None":
        """The connection while it is up, else None."""
        return self.conn if self.connected else None

    def ensure_connected(self) -> bool:
        """Open (or reopen) the connection if due; True when connected."""
        if self.conn is not None and self._lost.is_set():
            self._drop()
        if self.conn is not None:
            return True
        now = time.monotonic()
        if now < self._next_try:
            return False
        start_event_loop()
        try:
            conn = libvirt.open(self.uri)
            conn.setKeepAlive(5, 3)
            conn.registerCloseCallback(self._closed, None)
            for name in _EVENTS:
                event = getattr(libvirt, name, None)
                if event is not None:
                    conn.domainEventRegisterAny(None, event, self._event, None)
        except libvirt.libvirtError as e:
            message = f"cannot connect to {self.uri}: {e.get_error_message()}"
            if message != self.last_error:
                log.warning("libvirt=%s action=connect-failed retry_in=%.1fs error=%r", self.uri, self._backoff, message)
            self.last_error = message
            self._next_try = now + self._backoff
            self._backoff = min(self._backoff * 2, 10.0)
            return False
        self.conn = conn
        self._lost.clear()
        self._backoff = 0.5
        self.last_error = None
        log.info("libvirt=%s action=connected", self.uri)
        return True

    def _drop(self) -> None:
        conn, self.conn = self.conn, None
        try:
            conn.close()
        except libvirt.libvirtError:
            pass
        log.warning("libvirt=%s action=disconnected", self.uri)

    def _closed(self, _conn, reason, _opaque):
        log.warning("libvirt=%s action=connection-closed reason=%s", self.uri, _CLOSE_REASONS.get(reason, reason))
        self._lost.set()
        self.on_change()

    def _event(self, *_args):
        self.on_change()

    def lost(self) -> None:
        """Mark the connection broken (a call failed with a connection error)."""
        self._lost.set()

    def domains(self) -> list[DomainFacts] | None:
        """Facts of every running domain, or None when libvirt is unreachable.

        A domain that stops while being read is skipped, not an error.
        """
        if not self.ensure_connected():
            return None
        try:
            listed = self.conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE)
        except libvirt.libvirtError as e:
            log.warning("libvirt=%s action=list-failed error=%r", self.uri, e.get_error_message())
            self.lost()
            return None
        facts = []
        for dom in listed:
            try:
                facts.append(DomainFacts(dom.name(), dom.UUIDString(), dom.XMLDesc(0)))
            except libvirt.libvirtError as e:
                if domain_gone(e):
                    continue
                log.warning("libvirt=%s action=read-failed error=%r", self.uri, e.get_error_message())
                self.lost()
                return None
        return facts

    def vcpu_stats(self) -> dict[str, dict]:
        """libvirt's vCPU statistics of every running domain, by uuid
        (``virConnectGetAllDomainStats``, ``VIR_DOMAIN_STATS_VCPU``): the
        hypervisor's own per-vCPU counters among them, where it keeps any
        (:mod:`cosched.sampler.kvm`). Empty while disconnected."""
        conn = self.live_conn
        if conn is None:
            return {}
        got = conn.getAllDomainStats(libvirt.VIR_DOMAIN_STATS_VCPU, libvirt.VIR_CONNECT_GET_ALL_DOMAINS_STATS_ACTIVE)
        return {dom.UUIDString(): dict(records) for dom, records in got}

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except libvirt.libvirtError:
                pass
            self.conn = None
