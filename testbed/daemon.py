"""Run ``cosched daemon`` as a subprocess, for tests, the demo and benchmarks."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DaemonProcess:
    """``cosched daemon`` as a subprocess with its own configuration, state
    directory (``TMP/state``, or the default ``/run/cosched``) and port;
    ``cwd``: the checkout whose ``cosched`` it runs (default: this one)."""

    def __init__(self, tmp: Path, extra_config: str = "", state_dir: str | None = None, port: int | None = None,
                 presets_dirs: tuple[str, ...] = (), cwd: Path | None = None):
        self.tmp = Path(tmp)
        self.cwd = cwd
        self.port = port or free_port()
        self.state_dir = state_dir or f"{tmp}/state"
        self.config = self.tmp / "cosched.toml"
        dirs = ", ".join(f'"{d}"' for d in presets_dirs)
        self.config.write_text(f'state_dir = "{self.state_dir}"\npresets_dirs = [{dirs}]\n{extra_config}')
        self.log = self.tmp / "daemon.log"
        self.proc: subprocess.Popen | None = None

    def start(self, *args: str, env: dict | None = None, timeout: float = 30.0) -> "DaemonProcess":
        """Start it (``env``: extra environment variables) and wait until it answers."""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cosched", "daemon", "--config", str(self.config),
             "--metrics-address", f"127.0.0.1:{self.port}", *args],
            stdout=subprocess.DEVNULL, stderr=open(self.log, "w"), start_new_session=True, cwd=self.cwd,
            env={**os.environ, **({"PYTHONPATH": str(self.cwd)} if self.cwd else {}), **(env or {})})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.status() is not None:
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited:\n{self.log.read_text()}")
            time.sleep(0.1)
        # never leave one behind: it would go on managing every annotated guest on the host
        os.killpg(os.getpgid(self.proc.pid), signal.SIGKILL)
        self.proc.wait()
        raise TimeoutError(f"daemon did not answer within {timeout:g}s (killed, with its switcher):\n"
                           f"{self.log.read_text()}")

    def ask(self, what: str = "status") -> dict | None:
        """One control-socket request (None: no answer)."""
        from cosched.control import request
        try:
            # a daemon starved by busy guests on a 2-CPU host may answer late; late is an answer
            return request(f"{self.state_dir}/cosched.sock", what, timeout=10)
        except (OSError, ValueError):
            return None

    def status(self) -> dict | None:
        return self.ask()

    def explain(self, name: str) -> dict | None:
        """``cosched explain NAME`` as the daemon answers it."""
        return self.ask(f"explain {name}")

    def domain(self, name: str) -> dict | None:
        s = self.status() or {"domains": []}
        return next((d for d in s["domains"] if d["name"] == name), None)

    def metrics(self) -> str:
        import urllib.request
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            return r.read().decode()

    def cpu_seconds(self) -> float:
        """CPU time so far of the daemon and its children (the switcher)."""
        return sum(self.cpu_split())

    def cpu_split(self) -> tuple[float, float]:
        """CPU seconds so far of the daemon alone and of its children (the switcher)."""
        import psutil
        p = psutil.Process(self.proc.pid)
        children = 0.0
        for c in p.children(recursive=True):
            try:
                children += sum(c.cpu_times()[:2])
            except psutil.NoSuchProcess:
                pass
        return sum(p.cpu_times()[:2]), children

    def digest(self, chars: int = 10000, stacks: bool = False) -> str:
        """The log's last ``chars`` characters, each run of ``action=restored``
        lines told in one (first and last time, count); with ``stacks``, the
        daemon and its switcher first write their threads' stacks to it
        (SIGUSR1), to show where a stuck one waits."""
        if stacks and self.proc and self.proc.poll() is None:
            import psutil
            daemon = psutil.Process(self.proc.pid)
            for p in [daemon, *daemon.children()]:
                try:
                    p.send_signal(signal.SIGUSR1)
                except psutil.Error:
                    pass
            time.sleep(0.5)
        out, run = [], []
        for line in self.log.read_text().splitlines() + [""]:
            if "action=restored " in line:
                run.append(line)
                continue
            if run:
                out.append(run[0] if len(run) == 1 else
                           f"{run[0][:23]} .. {run[-1][11:23]} {len(run)} x action=restored "
                           f"({', '.join(sorted({r.split(' kind=')[1].split()[0] for r in run}))})")
                run = []
            out.append(line)
        return "\n".join(out)[-chars:]

    def wait(self, predicate, timeout: float, what: str):
        """Poll ``predicate()`` until truthy; return (value, seconds taken)."""
        start = time.monotonic()
        while True:
            value = predicate()
            if value:
                return value, time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise AssertionError(f"{what}: not within {timeout}s\n--- daemon log ---\n{self.digest(stacks=True)}")
            time.sleep(0.05)

    def stop(self) -> int:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                raise
        return self.proc.returncode if self.proc else 0
