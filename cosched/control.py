"""The control socket: ``cosched status`` asks the running daemon over a
root-only Unix socket (``/run/cosched/cosched.sock``, mode 0600).

Protocol: the client sends one line (``status`` or ``reset``) and reads one
JSON document until the server closes the connection.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
from typing import Callable

log = logging.getLogger("cosched.control")


class ControlServer:
    def __init__(self, path: str, handler: Callable[[str], dict]):
        self.path = path
        self.handler = handler
        self.sock: socket.socket | None = None

    def start(self) -> None:
        """Claim the socket: fails if another daemon answers on it."""
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        if os.path.exists(self.path):
            if _answers(self.path):
                raise RuntimeError(f"another cosched daemon is running (it answers on {self.path})")
            os.unlink(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(self.path)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        sock.listen(8)
        self.sock = sock

    def serve(self) -> None:
        """Start answering (requests made since :meth:`start` wait in the backlog)."""
        threading.Thread(target=self._serve, name="control", daemon=True).start()

    def _serve(self) -> None:
        while self.sock is not None:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.settimeout(30.0)
                    reply = self.handler(conn.recv(256).decode(errors="replace").strip())
                    conn.sendall(json.dumps(reply).encode())
                except Exception as e:  # a bad client never stops the daemon
                    log.warning("action=control-request-failed error=%r", str(e))

    def stop(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def _answers(path: str) -> bool:
    try:
        request(path, "status", timeout=1.0)
        return True
    except OSError:
        return False


def request(path: str, what: str = "status", timeout: float = 5.0) -> dict:
    """Send one request to the daemon; raises OSError when none answers."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(what.encode() + b"\n")
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    return json.loads(b"".join(chunks))
