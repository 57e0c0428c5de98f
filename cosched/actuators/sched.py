"""SCHED_FIFO boosts of vCPU threads, and the RT runtime they need.

``os.sched_setscheduler`` raises a vCPU thread to SCHED_FIFO so ordinary
(CFS) tasks cannot preempt it. On kernels built with RT group scheduling
(``CONFIG_RT_GROUP_SCHED``: ``cpu.rt_runtime_us`` exists in the v1 cpu
controller) that fails with EPERM unless every cgroup on the thread's cpu
path holds RT runtime; ``Host.rt_chain`` lists those files. The switcher hands runtime out top-down
and takes it back bottom-up (a parent cannot hold less than its children). Most distribution
kernels lack the option and need no grants.
"""
from __future__ import annotations

import os

from cosched.hostfs import HostFS

POLICIES = {"other": os.SCHED_OTHER, "fifo": os.SCHED_FIFO, "rr": os.SCHED_RR,
            "batch": getattr(os, "SCHED_BATCH", 3), "idle": getattr(os, "SCHED_IDLE", 5)}


def set_policy(tid: int, policy: str, priority: int = 0) -> None:
    """Set a thread's policy by name (``other``, ``fifo``, ...)."""
    os.sched_setscheduler(tid, POLICIES[policy], os.sched_param(priority if policy in ("fifo", "rr") else 0))


def read_runtime(fs: HostFS, path: str) -> int:
    return int(fs.read(path).strip())
