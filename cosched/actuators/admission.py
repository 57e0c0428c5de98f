"""The kernel's deadline admission total: see when it is wrong, and recount it.

The kernel adds the bandwidth of every SCHED_DEADLINE thread to its root
domain's admission total (``dl_bw->total_bw``) and refuses (EBUSY) a
request that would take the total past the cap (95% of the CPUs by
default). On a host where cosched boosts, that total can be wrong, and then
every deadline request on the host is refused; this knob sees it and has the
kernel count the total again.

How it works, with the measurements behind it: ``docs/design/admission.md``.
"""
from __future__ import annotations

import errno
import logging
import subprocess
import time

from cosched.actuators.sched import SchedAttr, set_attr, zero_bandwidth
from cosched.hostfs import HostFS, mount_point, parse_cpu_list
from cosched.kernel import parse_stat

log = logging.getLogger("cosched.admission")

RECOUNT_DIR = "cosched-recount"
ASLEEP_WAIT_S = 0.5         # a new ``cat`` blocks reading its pipe within milliseconds
RELEASE_WAIT_MAX_NS = 1_000_000_000   # the longest wait for released bandwidth (a boost's: milliseconds)


class Admission:
    """Check the kernel's deadline admission total, and recount it.

    ``put`` gives a thread scheduling attributes (``set_attr``, or a
    test's fake: no test changes a real thread's policy); ``mount`` is the
    v1 cpuset hierarchy's mount point (found from ``/proc/self/mountinfo``
    when not given; None: there is none).
    """

    def __init__(self, fs: HostFS, put=None, mount: str | None = "", sleep=time.sleep):
        self.fs = fs
        self.put = put or set_attr
        self.mount = mount_point(fs, "cgroup", "cpuset") if mount == "" else mount
        self.sleep = sleep
        self._child: subprocess.Popen | None = None

    def wrong(self) -> bool | None:
        """True when the kernel refuses a deadline reservation of no
        bandwidth (its total is past the cap: wrong); False when it grants
        it; None when that cannot be asked (not allowed, no such call)."""
        pid = self._asleep()
        if pid is None:
            return None
        try:
            self.put(pid, zero_bandwidth(self.fs))
        except OSError as e:
            return True if e.errno == errno.EBUSY else None
        try:
            self.put(pid, SchedAttr())
        except OSError:
            pass                            # it holds no bandwidth, and exits with cosched
        return False

    def _asleep(self) -> int | None:
        """The PID of the child kept asleep for :meth:`wrong` (started on
        first use, given the ordinary policy), once it sleeps; None if it
        cannot be started."""
        if self._child is None or self._child.poll() is not None:
            try:
                self._child = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL)
            except OSError:
                return None
            try:
                self.put(self._child.pid, SchedAttr())     # not the caller's realtime policy
            except OSError:
                pass
        waited = 0.0
        while waited < ASLEEP_WAIT_S:
            stat = parse_stat(self.fs.read_or(f"/proc/{self._child.pid}/stat") or "")
            if stat is None or stat.state == "S":        # not readable (a fake root): nothing to wait for
                break
            self.sleep(0.001)
            waited += 0.001
        return self._child.pid

    def close(self) -> None:
        """End the child kept for :meth:`wrong`."""
        child, self._child = self._child, None
        if child is not None:
            child.stdin.close()
            child.wait()

    def recount(self) -> None:
        """Make the kernel count its deadline admission total again (the
        module doc says how, and when it is right). OSError when it cannot:
        no v1 cpuset hierarchy, or the cpuset refused."""
        if self.mount is None:
            raise OSError(errno.EOPNOTSUPP, "no v1 cpuset hierarchy (cgroup v2 only): only a cpuset partition change "
                                            "or a reboot recounts it")
        path = f"{self.mount}/{RECOUNT_DIR}"
        self.cleanup()
        every = (self.fs.read_or(f"{self.mount}/cpuset.effective_cpus") or self.fs.read_or(
            f"{self.mount}/cpuset.cpus") or "").strip()
        self.fs.mkdir(path)
        try:
            # a CPU an exclusive sibling cpuset holds is refused (EINVAL): then one CPU at a
            # time, until one is taken (a change of a load-balanced cpuset's CPUs recounts)
            for cpus in [every] + [str(cpu) for cpu in parse_cpu_list(every)]:
                try:
                    self.fs.write(f"{path}/cpuset.cpus", cpus)
                    return
                except OSError as e:
                    if e.errno != errno.EINVAL:
                        raise
                    refused = e
            raise refused
        finally:
            self._remove(path)

    def _remove(self, path: str) -> None:
        try:
            self.fs.write(f"{path}/cpuset.cpus", "\n")    # removed with CPUs it would rebuild again, later
        finally:
            self.fs.rmdir(path)

    def cleanup(self) -> None:
        """Remove a recount directory a killed process left (empty: no task is ever put in it)."""
        if self.mount is not None and self.fs.exists(f"{self.mount}/{RECOUNT_DIR}"):
            self._remove(f"{self.mount}/{RECOUNT_DIR}")
            log.info("action=removed-leftover path=%s/%s", self.mount, RECOUNT_DIR)

    def repair(self) -> str | None:
        """Check the total and, if it is wrong, recount it and check again.
        Call it only when no deadline bandwidth of cosched's is pending
        release. Returns what is still wrong (None: nothing), logged."""
        if not self.wrong():
            return None
        log.warning("action=admission-wrong reason='the kernel refuses a deadline reservation of no bandwidth: its "
                    "admission total is wrong: deadline requests on the host are refused'")
        try:
            self.recount()
        except OSError as e:
            problem = f"deadline admission total wrong (requests refused) and cannot be recounted: {e.strerror or e}"
            log.error("action=admission-recount-failed error=%r", problem)
            return problem
        if self.wrong():
            problem = "deadline admission still wrong after a recount (another program's deadline threads " \
                      "may hold the bandwidth, or have some pending release)"
            log.error("action=admission-recount-failed error=%r", problem)
            return problem
        log.warning("action=admission-recounted")
        return None


def recount_after_release(fs: HostFS, sched, until: int = 0, sleep=time.sleep) -> str | None:
    """After cosched's last deadline return: wait until the kernel has let
    go of the bandwidth its returns left counted (``until``, a switcher's
    :meth:`~cosched.actuators.sched.SchedKnob.released_by`, and ``sched``'s
    own, on its clock; :data:`RELEASE_WAIT_MAX_NS` at most), then check the total
    and recount it if it is wrong (:meth:`Admission.repair`): a pinning
    change made meanwhile (the daemon's exit and ``cosched reset`` put
    pinning back) must not leave it wrong after cosched has gone."""
    admission = Admission(fs, put=sched.set, sleep=sleep)
    admission.cleanup()
    wait = min(max(until, sched.released_by()) - sched.clock(), RELEASE_WAIT_MAX_NS)
    if wait > 0:
        sleep(wait / 1e9)
    try:
        return admission.repair()
    finally:
        admission.close()
