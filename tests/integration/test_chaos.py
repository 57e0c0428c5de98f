"""Faults on a live host: kills, a libvirtd restart, annotation storms.

**SIGKILL at random points of a rotation: nothing outlives ``max_stall_ms``.**
Three busy 2-vCPU guests: two take turns under ``gang``, the third is watched
under ``relaxed`` with boosts. Round after round, at a random moment once the
daemon enforces, the test SIGKILLs the daemon together with its switcher
(then starts the daemon again, on the same journal) or the switcher alone
(the daemon restores what it left and starts a new one). A sampler reads every
vCPU's freeze state and scheduling policy every millisecond from before the
kill until well after the restart.

What a killed switcher left behind (a vCPU frozen, or boosted above the
policy it had) must be gone within ``max_stall_ms`` of the restart: of the
daemon answering again, or of the kill when only the switcher died. Once back,
the gang rotates again (its pinning is a rotation's, not a leftover), and
after the last round a clean stop leaves the host as it was.

``COSCHED_KILLS`` rounds (default 6, half of each kind); ``make soak`` runs 100.

**Back fast under load.** Three busy ``gang`` guests pinned on every host
CPU; the daemon, SIGKILLed with its switcher, is started again
``COSCHED_RESTARTS`` times (default 12): the time from its exec until its
metrics answer and its rotation runs again (a slot change counted) is a
figure (median, range) in ``make soak``'s table, whose target is 3 s; the
test fails only past 10 s, a start-up held back as it once was (37 s).

**A stopped switcher** (SIGSTOP: as if starved of CPU or stuck): the
daemon kills it, and nothing it froze or boosted outlives ``max_stall_ms``.

**Real guests coming and going** next to a rotation leave nothing behind.

**libvirtd restarted under load**: the rotation never stops, the daemon is
connected again within 5 s of libvirtd answering, and a policy change made
afterwards is taken up. **An annotation flapping** every 100 ms between
``gang`` and ``none`` for 10 s: the daemon keeps running, settles on the last
one, and nothing is left behind.
"""
from __future__ import annotations

import os
import random
import signal
import threading
import time

import psutil
import pytest

from tests.support.soak import record
from testbed import guests, services

from .conftest import PREFIX, DaemonProcess
from .test_enforce import host_state, set_policy, vcpu_cgroups

NAMES = [PREFIX + f"kill-{c}" for c in "abc"]
ROUNDS = int(os.environ.get("COSCHED_KILLS", "6"))
RESTARTS = int(os.environ.get("COSCHED_RESTARTS", "12"))
BACK_WITHIN = 10.0       # seconds from exec to managing again: a regression, not the 3 s target
MAX_STALL = 0.5
SAMPLE = 0.001
SLACK = 0.05             # the sampler's own lateness on a busy 2-CPU host


@pytest.fixture(scope="module")
def busy(libvirtd, guest_image):
    started = []
    try:
        for name in NAMES:
            with guests.paused(list(started)):
                started.append(guests.start(name, workload="barrier", image=guest_image))
                started[-1].wait_for("cosched-result")
        yield started
    finally:
        for g in started:
            g.destroy()


class Sampler(threading.Thread):
    """Every millisecond, which vCPUs are frozen and which run above SCHED_OTHER/BATCH/IDLE."""

    def __init__(self):
        super().__init__(daemon=True)
        self.files = {cg: f"{cg}/cgroup.events" for n in NAMES for cg in vcpu_cgroups(n)}
        self.tids = {cg: int(open(f"{cg}/cgroup.threads").read().split()[0]) for cg in self.files}
        self.samples: list[tuple[float, frozenset, frozenset]] = []
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            frozen, boosted = set(), set()
            for cg, events in self.files.items():
                if open(events).read().split()[-1] == "1":
                    frozen.add(cg)
                try:
                    if os.sched_getscheduler(self.tids[cg]) not in (os.SCHED_OTHER, os.SCHED_BATCH, os.SCHED_IDLE):
                        boosted.add(cg)
                except OSError:
                    pass
            self.samples.append((time.monotonic(), frozenset(frozen), frozenset(boosted)))
            time.sleep(SAMPLE)

    @staticmethod
    def deadline(up: float) -> float:
        """By when what was frozen or boosted at a kill must be undone: ``max_stall_ms`` after ``up``."""
        return up + MAX_STALL + SLACK

    def stop_after(self, t: float, timeout: float = 10.0) -> None:
        """Stop once a sample was taken after ``t`` (it can be held up)."""
        end = time.monotonic() + timeout
        while not any(s[0] > t for s in self.samples[-3:]) and time.monotonic() < end:
            time.sleep(0.01)
        self.halt.set()
        self.join()

    def leftovers(self, killed: float, up: float) -> list[str]:
        """Stretches of freezing or boosting under way at the kill that were
        still seen after ``up + MAX_STALL``. The sampler is a thread of the
        test, which a loaded host can hold up for a second or more: a vCPU is
        judged by the last sample that saw it so, and the samples must
        reach past that deadline."""
        deadline = self.deadline(up)
        if not any(t > deadline for t, *_ in self.samples):
            return [f"no sample after the deadline ({deadline - up:.3f} s after the restart): nothing judged"]
        out = []
        for what, index in (("frozen", 1), ("boosted", 2)):
            for cg in self.files:
                at_kill = [s for s in self.samples if s[0] <= killed]
                if not at_kill or cg not in at_kill[-1][index]:
                    continue
                ended = next((t for t, *sets in self.samples if t > killed and cg not in sets[index - 1]), None)
                seen = max(t for t, *sets in self.samples if cg in sets[index - 1] and (ended is None or t < ended))
                if ended is None or seen > deadline:
                    out.append(f"{cg} {what} at the kill, still {what} "
                               f"{'to the end' if ended is None else f'{seen - up:.3f} s after the restart'}")
        return out


def enforcing(daemon: DaemonProcess, switches: int):
    s = daemon.status()
    if not s:
        return False
    doms = {d["name"]: d for d in s["domains"]}
    return (s["daemon"]["engine"]["switches"].get("gang", 0) >= switches and
            sum(v["costops"] + v["boosts"] for v in doms[NAMES[2]]["vcpus"]) > 0)


def test_sigkill_at_random_points_leaves_nothing_past_max_stall(busy, tmp_path):
    for name in NAMES[:2]:
        set_policy(name, '<policy name="gang"/>')
    set_policy(NAMES[2], '<policy name="relaxed" boost="true"/>')
    before = host_state(NAMES)
    rng = random.Random(int(os.environ.get("COSCHED_KILL_SEED", "0")) or None)
    daemon = DaemonProcess(tmp_path).start()
    problems, kinds, logs = [], {"daemon": 0, "switcher": 0}, []
    try:
        for n in range(ROUNDS):
            switches = daemon.status()["daemon"]["engine"]["switches"].get("gang", 0)
            daemon.wait(lambda: enforcing(daemon, switches + 3), 20, "gang rotating and relaxed acting")
            kind = "daemon" if n % 2 == 0 else "switcher"
            sampler = Sampler()
            sampler.start()
            while len(sampler.samples) < 5:                        # it sees the state before the kill
                time.sleep(0.001)
            time.sleep(rng.uniform(0.0, 0.15))                     # a random point of the rotation
            if kind == "daemon":
                os.killpg(os.getpgid(daemon.proc.pid), signal.SIGKILL)
                daemon.proc.wait()
                killed, wall = time.monotonic(), time.time()
                daemon.start(timeout=90)           # busy guests left pinned can hold its start-up back
                up = time.monotonic()
            else:
                switcher = psutil.Process(daemon.proc.pid).children()
                assert len(switcher) == 1, switcher
                switcher[0].kill()
                killed = up = time.monotonic()
                wall = time.time()
            time.sleep(MAX_STALL + 0.5)
            sampler.stop_after(sampler.deadline(up))
            kinds[kind] += 1
            assert any(s[1] or s[2] for s in sampler.samples if s[0] <= killed), \
                f"round {n}: nothing was frozen or boosted when {kind} was killed: nothing tested"
            found = sampler.leftovers(killed, up)
            problems += [f"round {n} ({kind} killed): {p}" for p in found]
            if found:                  # a later round's restart starts a new log: keep this one's now
                logs.append(f"--- daemon log after round {n} (killed at "
                            f"{time.strftime('%H:%M:%S', time.localtime(wall))}) ---\n{daemon.digest()}")
            record("SIGKILL of the daemon or its switcher mid-rotation", cycles=1, faults=1, leaks=len(found),
                   exits=int(daemon.proc.poll() is not None))
            assert daemon.proc.poll() is None, daemon.digest()
    finally:
        assert daemon.stop() == 0
    assert problems == [], "\n".join(problems + logs)
    assert kinds == {"daemon": (ROUNDS + 1) // 2, "switcher": ROUNDS // 2}
    assert host_state(NAMES) == before


def rotating(daemon: DaemonProcess) -> bool:
    """The daemon's metrics answer and count a slot change of its gang cell."""
    import urllib.error
    try:
        text = daemon.metrics()
    except (OSError, urllib.error.URLError):
        return False
    return any(line.startswith('cosched_switches_total{cell="gang"}') and float(line.split()[-1]) > 0
               for line in text.splitlines())


def test_a_killed_daemon_manages_again_soon_with_every_cpu_busy(busy, tmp_path):
    for name in NAMES:
        set_policy(name, '<policy name="gang"/>')
    before = host_state(NAMES)
    daemon = DaemonProcess(tmp_path).start()
    took = []
    try:
        for _ in range(RESTARTS):
            daemon.wait(lambda: rotating(daemon), 20, "a gang of three rotating")
            time.sleep(0.3)
            os.killpg(os.getpgid(daemon.proc.pid), signal.SIGKILL)
            daemon.proc.wait()
            t0 = time.monotonic()
            daemon.start(timeout=30)
            daemon.wait(lambda: rotating(daemon), 30, "rotating again after the restart")
            took.append(time.monotonic() - t0)
    finally:
        assert daemon.stop() == 0
    after = host_state(NAMES)
    ranked = sorted(took)
    record("daemon SIGKILLed and started again with every CPU busy", cycles=len(took), faults=len(took),
           leaks=int(after != before), exits=0,
           notes=f"exec to managing again (metrics and a slot change): median {ranked[len(ranked) // 2]:.2f} s, "
                 f"{ranked[0]:.2f}-{ranked[-1]:.2f} s over {len(took)} restarts")
    assert after == before
    assert len(took) >= 1 and max(took) <= BACK_WITHIN, [round(t, 2) for t in took]


def test_a_stopped_switcher_is_killed_and_nothing_outlives_max_stall(busy, tmp_path):
    """The switcher starved of CPU, stuck or stopped (here: SIGSTOP at a random
    point of the rotation) gives no more slot changes and no reports: the
    daemon's watchdog kills it, what it froze or boosted is undone within
    ``max_stall_ms`` of the stop, the thaws are counted, and a new switcher
    takes over the rotation."""
    for name in NAMES[:2]:
        set_policy(name, '<policy name="gang"/>')
    set_policy(NAMES[2], '<policy name="relaxed" boost="true"/>')
    before = host_state(NAMES)
    rng = random.Random()
    daemon = DaemonProcess(tmp_path).start()
    try:
        daemon.wait(lambda: enforcing(daemon, 3), 20, "gang rotating and relaxed acting")
        switcher = psutil.Process(daemon.proc.pid).children()
        assert len(switcher) == 1, switcher
        forced = daemon.status()["daemon"]["engine"]["forced_thaws"]
        sampler = Sampler()
        sampler.start()
        while len(sampler.samples) < 5:
            time.sleep(0.001)
        time.sleep(rng.uniform(0.0, 0.15))
        switcher[0].suspend()                                      # SIGSTOP
        stopped, wall = time.monotonic(), time.time()
        time.sleep(MAX_STALL + 0.5)
        sampler.stop_after(sampler.deadline(stopped))
        assert any(s[1] for s in sampler.samples if s[0] <= stopped), "nothing was frozen at the stop: nothing tested"
        problems = sampler.leftovers(stopped, stopped)
        record("switcher stopped (SIGSTOP) mid-rotation", cycles=1, faults=1, leaks=len(problems),
               exits=int(daemon.proc.poll() is not None))
        assert problems == [], "\n".join(problems) + f"\nstopped at {time.strftime('%H:%M:%S', time.localtime(wall))}" \
                                                     f"\n--- daemon log ---\n{daemon.digest(stacks=True)}"
        assert not switcher[0].is_running() or switcher[0].status() == psutil.STATUS_ZOMBIE, "the stopped one lives"
        assert "action=switcher-stalled" in daemon.log.read_text()
        daemon.wait(lambda: daemon.status()["daemon"]["engine"]["forced_thaws"] > forced, 5, "the thaws counted")
        switches_now = switches(daemon)
        daemon.wait(lambda: switches(daemon) > switches_now + 3, 10, "a new switcher rotating")
        assert [p.pid for p in psutil.Process(daemon.proc.pid).children()] != [switcher[0].pid]
    finally:
        assert daemon.stop() == 0
    assert host_state(NAMES) == before


REAL_CYCLES = int(os.environ.get("COSCHED_REAL_CYCLES", "3"))


def test_real_guests_coming_and_going_leak_nothing(busy, guest_image, tmp_path):
    """``COSCHED_REAL_CYCLES`` real TCG guests (3 here, 50 in ``make soak``),
    under ``gang``, ``relaxed`` and ``none`` in turn, each created, taken up
    and destroyed while two busy guests rotate: nothing of them is left in
    the journal, the daemon stays up, the rotation goes on, and a clean stop
    leaves the host as it was."""
    import psutil

    from cosched.actuators.journal import Journal
    for name in NAMES[:2]:
        set_policy(name, '<policy name="gang"/>')
    set_policy(NAMES[2], '<policy name="none"/>')
    before = host_state(NAMES)
    daemon = DaemonProcess(tmp_path).start()
    try:
        daemon.wait(lambda: switches(daemon) > 5, 20, "a gang of two rotating")
        rss = []
        for n in range(REAL_CYCLES):
            policy, name = ("gang", "relaxed", "none")[n % 3], f"{PREFIX}cycle-{n}"
            g = guests.start(name, workload="idle", image=guest_image, policy=guests.annotation(policy))
            try:
                daemon.wait(lambda: (d := daemon.domain(name)) and len(d["vcpus"]) == 2
                            and (d["managed"] or policy == "none"), 30, f"cycle {n}: {name} taken up")
            finally:
                g.destroy()
            daemon.wait(lambda: daemon.domain(name) is None, 10, f"cycle {n}: {name} gone")
            rss.append(psutil.Process(daemon.proc.pid).memory_info().rss)
        now = switches(daemon)
        daemon.wait(lambda: switches(daemon) > now + 5, 10, "still rotating")
        entries = Journal(f"{daemon.state_dir}/journal.json").entries.values()
        leaked = [e for e in entries if "cycle-" in str(e.get("name") or e.get("path"))]
        record("real guests created and destroyed next to a rotation", cycles=REAL_CYCLES, leaks=len(leaked),
               exits=int(daemon.proc.poll() is not None),
               notes=f"daemon RSS {rss[0] / 2**20:.0f} MiB after the first, {rss[-1] / 2**20:.0f} MiB after the last")
        assert not leaked, leaked
        assert daemon.proc.poll() is None
    finally:
        assert daemon.stop() == 0
    log = daemon.log.read_text()           # relaxed guests hold RT runtime where the kernel has RT group scheduling
    assert "was removed holding" not in log and "restored=all" in log, log[-3000:]
    set_policy(NAMES[2], '<policy name="gang"/>')
    assert host_state(NAMES) == before


def switches(daemon: DaemonProcess) -> int:
    return (daemon.status() or {"daemon": {"engine": {"switches": {}}}})["daemon"]["engine"]["switches"].get("gang", 0)


def test_libvirtd_restart_under_load_keeps_the_rotation_and_resyncs(busy, tmp_path):
    for name in NAMES:
        set_policy(name, '<policy name="gang"/>')
    before = host_state(NAMES)
    daemon = DaemonProcess(tmp_path).start()
    try:
        daemon.wait(lambda: switches(daemon) > 5, 20, "a gang of three rotating")
        services.stop("libvirtd")
        daemon.wait(lambda: not daemon.status()["daemon"]["libvirt"]["connected"], 15, "libvirtd gone")
        during = switches(daemon)
        time.sleep(1.0)
        assert switches(daemon) > during + 5, "the rotation stopped without libvirtd"
        services.ensure()
        answered = time.monotonic()
        daemon.wait(lambda: daemon.status()["daemon"]["libvirt"]["connected"], 15, "reconnected")
        assert time.monotonic() - answered <= 5.0, f"reconnected {time.monotonic() - answered:.1f} s after libvirtd answered"
        set_policy(NAMES[2], '<policy name="none"/>')        # enforcement follows libvirt again
        daemon.wait(lambda: [len(c["members"]) for c in daemon.status()["daemon"]["engine"]["cells"]] == [2], 5,
                    "the guest left the gang")
        assert daemon.proc.poll() is None
    finally:
        assert daemon.stop() == 0
    set_policy(NAMES[2], '<policy name="gang"/>')
    after = host_state(NAMES)
    record("libvirtd restarted under load", cycles=1, faults=1, leaks=int(after != before), exits=0)
    assert after == before


def test_an_annotation_flapping_every_100_ms_settles_and_leaves_nothing(busy, tmp_path):
    for name in NAMES:
        set_policy(name, '<policy name="gang"/>')
    before = host_state(NAMES)
    daemon = DaemonProcess(tmp_path).start()
    try:
        daemon.wait(lambda: switches(daemon) > 5, 20, "a gang of three rotating")
        flips = 0
        end = time.monotonic() + 10
        while time.monotonic() < end:
            set_policy(NAMES[2], '<policy name="none"/>' if flips % 2 == 0 else '<policy name="gang"/>')
            flips += 1
            time.sleep(0.1)
        last = "none" if flips % 2 == 1 else "gang"
        members = 2 if last == "none" else 3
        daemon.wait(lambda: [len(c["members"]) for c in daemon.status()["daemon"]["engine"]["cells"]] == [members]
                    and daemon.domain(NAMES[2])["policy"] == last, 3, f"settled on {last}")
        assert flips >= 30 and daemon.proc.poll() is None
        assert "Traceback" not in daemon.log.read_text()
    finally:
        assert daemon.stop() == 0
    set_policy(NAMES[2], '<policy name="gang"/>')
    after = host_state(NAMES)
    record("an annotation flapping every 100 ms for 10 s", cycles=flips, faults=flips, leaks=int(after != before),
           exits=0)
    assert after == before
