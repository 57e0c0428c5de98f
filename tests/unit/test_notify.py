"""The sd_notify protocol against a datagram socket standing in for systemd."""
import os
import socket

import pytest

from cosched.notify import Notifier


@pytest.fixture
def systemd(tmp_path):
    path = str(tmp_path / "notify")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(1)
    yield path, s
    s.close()


def received(s) -> list[str]:
    return s.recv(4096).decode().split("\n")


def test_ready_status_and_stopping(systemd):
    path, s = systemd
    n = Notifier({"NOTIFY_SOCKET": path})
    n.ready("2 guests observed")
    assert received(s) == ["READY=1", "STATUS=2 guests observed"]
    n.status("2 guests observed")          # unchanged: not sent again
    n.status("3 guests observed")
    assert received(s) == ["STATUS=3 guests observed"]
    n.reloading()
    assert received(s)[0] == "RELOADING=1"
    n.stopping()
    assert received(s) == ["STOPPING=1"]


def test_watchdog_every_half_interval(systemd):
    path, s = systemd
    n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"})
    assert n.watchdog_interval == 1.0
    assert n.watchdog(now=100.0) and received(s) == ["WATCHDOG=1"]
    assert not n.watchdog(now=100.5)
    assert n.watchdog(now=101.0)


def test_watchdog_meant_for_another_process_is_ignored(systemd):
    path, _ = systemd
    n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid() + 1)})
    assert n.watchdog_interval is None and not n.watchdog()


def test_abstract_socket_name():
    name = f"cosched-test-{os.getpid()}"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind("\0" + name)
    s.settimeout(1)
    try:
        Notifier({"NOTIFY_SOCKET": "@" + name}).ready("ok")
        assert received(s)[0] == "READY=1"
    finally:
        s.close()


def test_without_systemd_nothing_is_sent():
    n = Notifier({})
    assert not n.send("READY=1") and not n.watchdog()


def test_a_vanished_socket_is_logged_not_raised(tmp_path, caplog):
    assert not Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone")}).send("READY=1")
    assert "notify-failed" in caplog.text


def test_log_lines_carry_their_priority_for_journald(tmp_path):
    import logging
    import os

    from cosched import logs

    with open(tmp_path / "stream", "w") as stream:
        st = os.fstat(stream.fileno())
        env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        assert logs.to_journal(env, stream)
        assert not logs.to_journal({"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino + 1}"}, stream)   # another stream
        assert not logs.to_journal({}, stream)
    f = logs.JournalFormatter()
    rec = lambda level, msg: logging.LogRecord("cosched.engine", level, "x", 1, msg, None, None)
    assert f.format(rec(logging.WARNING, "domain=vm1 action=pin-failed")) == "<4>cosched.engine domain=vm1 action=pin-failed"
    assert f.format(rec(logging.ERROR, "a\nb")) == "<3>cosched.engine a\n<3>b"
    assert f.format(rec(logging.INFO, "x")).startswith("<6>")


def test_sigusr1_writes_every_threads_stack_to_the_log():
    """A cosched process that seems stuck shows where each thread waits, and goes on."""
    import subprocess
    import sys
    code = ("import os, signal, threading, time\n"
            "from cosched import logs\n"
            "logs.setup()\n"
            "def waiting_here(): time.sleep(30)\n"
            "threading.Thread(target=waiting_here, daemon=True).start()\n"
            "time.sleep(0.2)\n"
            "os.kill(os.getpid(), signal.SIGUSR1)\n"
            "print('still running')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout == "still running\n", out
    assert "in waiting_here" in out.stderr and "Current thread" in out.stderr, out.stderr
