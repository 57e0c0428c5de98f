"""The daemon under systemd's notification protocol, and SIGHUP reloads.

A datagram socket stands in for systemd (``$NOTIFY_SOCKET``); the daemon must
say READY=1 once it answers, feed a 1-second watchdog, keep STATUS= current,
and on SIGHUP reload its configuration without letting go of the guests it
manages.
"""
from __future__ import annotations

import signal
import socket
import threading
import time

from testbed import guests
from testbed.daemon import DaemonProcess


class FakeSystemd:
    def __init__(self, path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096).decode()
            except socket.timeout:
                continue
            now = time.monotonic()
            self.messages.extend((now, line) for line in data.split("\n"))

    def lines(self, since: float = 0.0) -> list[str]:
        return [m for t, m in list(self.messages) if t >= since]

    def close(self):
        self._stop.set()
        self._thread.join()
        self.sock.close()


def test_notify_watchdog_and_reload_keep_managed_guests(start_guest, tmp_path, libvirtd):
    systemd = FakeSystemd(tmp_path / "notify")
    d = DaemonProcess(tmp_path)
    base_config = d.config.read_text()
    d.start(env={"NOTIFY_SOCKET": systemd.path, "WATCHDOG_USEC": "1000000"})
    try:
        d.wait(lambda: "READY=1" in systemd.lines(), 5, "READY=1")
        gang = guests.annotation("gang")
        names = [start_guest(f"sd-{i}", workload="barrier", policy=gang).name for i in range(2)]
        d.wait(lambda: all((x := d.domain(n)) and x["managed"] for n in names), 20, "guests managed")
        d.wait(lambda: any("2 managed" in m for m in systemd.lines()), 5, "STATUS names the managed guests")

        start = time.monotonic()
        time.sleep(3)
        pings = systemd.lines(start).count("WATCHDOG=1")
        assert pings >= 4, f"{pings} watchdog pings in 3 s with WatchdogSec=1s"

        cells = {n: d.domain(n)["cell"] for n in names}
        switches = sum(d.status()["daemon"]["engine"]["switches"].values())
        d.config.write_text(base_config + "max_stall_ms = 400\nsample_interval_ms = 20\n")
        sent = time.monotonic()
        d.proc.send_signal(signal.SIGHUP)
        d.wait(lambda: "READY=1" in systemd.lines(sent), 5, "READY=1 after the reload")
        assert "RELOADING=1" in systemd.lines(sent)
        d.wait(lambda: "action=reloaded changed=sample_interval_ms,max_stall_ms" in d.log.read_text(), 2,
               "reload logged with what changed")
        d.wait(lambda: sum(d.status()["daemon"]["engine"]["switches"].values()) > switches + 10, 5,
               "the rotation goes on")
        status = d.status()
        assert status["daemon"]["sample_interval_ms"] == 20
        assert {n: d.domain(n)["cell"] for n in names} == cells
        assert all(d.domain(n)["managed"] for n in names)
        assert status["daemon"]["engine"]["max_stall_limit_ms"] == 400

        d.config.write_text(base_config + "max_stal_ms = 400\n")
        d.proc.send_signal(signal.SIGHUP)
        d.wait(lambda: "action=reload-refused" in d.log.read_text(), 3, "a bad configuration refused")
        assert "unknown key 'max_stal_ms'" in d.log.read_text()
        assert d.proc.poll() is None and all(d.domain(n)["managed"] for n in names)
    finally:
        assert d.stop() == 0
        systemd.close()
    assert "STOPPING=1" in systemd.lines()
