"""Actuators: one small module per knob cosched turns on the host.

``freezer`` (cgroup v2 ``cgroup.freeze`` of libvirt's per-vCPU cgroups),
``sched`` (SCHED_FIFO boosts and, on kernels with RT group scheduling, the
``cpu.rt_runtime_us`` grants they need), ``pinning`` (libvirt's own vCPU
pinning API). Before its first write to anything, the engine records the
original value in the :mod:`~cosched.actuators.journal`; ``cosched reset``
and the daemon's exit replay it.
"""
