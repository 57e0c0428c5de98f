"""What the sampler accumulates per vCPU and guest, and the views it hands out."""
from __future__ import annotations

from dataclasses import dataclass, field

from cosched.histogram import Histogram
from cosched.sampler.estimate import VcpuCarry

SKEW_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)


@dataclass
class VcpuStats:
    tid: int
    fd: int | None
    run_ns: int = 0             # last cumulative schedstat values
    wait_ns: int = 0
    costop: float = 0.0         # last cumulative costop seconds (its cgroup's frozen time, or the engine's)
    frozen_fd: int | None = None  # its v2 cgroup.stat.local (frozen_usec), where the kernel has it
    carry: VcpuCarry = field(default_factory=VcpuCarry)
    stat_fd: int | None = None  # /proc/.../stat, for the thread's state
    runnable: bool = False      # state R at the last sample
    cpu: int | None = None      # host CPU at the last sample
    base: tuple[int, int] | None = None  # metered: run and wait ns when the meter's count began
    lag: float = 0.0            # metered: last wait + frozen seconds


@dataclass
class DomainStats:
    name: str
    vcpus: dict[int, VcpuStats] = field(default_factory=dict)
    hazard: float = 0.0
    partial: float = 0.0
    observed: float = 0.0       # seconds of windows measured
    until: float | None = None  # CLOCK_MONOTONIC seconds at which the last window measured ended
    skew: Histogram = field(default_factory=lambda: Histogram(SKEW_BUCKETS))
    last_skew: float = 0.0
    metered: tuple[float, float] = (0.0, 0.0)   # metered: last hazard and partial seconds


@dataclass(frozen=True)
class VcpuView:
    """One vCPU's cumulative seconds, as the kernel credits them (``run``,
    ``wait``), and ``waiting``: a wait in progress that the kernel has not
    credited yet (the thread stayed runnable without running, see
    :mod:`cosched.sampler.estimate`). The kernel credits a wait only when it
    ends, so a vCPU the host scheduler starves for seconds looks idle by
    ``wait`` alone; ``auto`` counts ``wait + waiting``."""

    index: int
    tid: int
    run: float
    wait: float
    waiting: float = 0.0


@dataclass(frozen=True)
class DomainView:
    uuid: str
    name: str
    vcpus: tuple[VcpuView, ...]
    hazard: float
    partial: float
    observed: float
    skew_buckets: tuple[tuple[str, int], ...]
    skew_sum: float
    skew_count: int
    last_skew: float
    until: float | None = None  # CLOCK_MONOTONIC seconds: the figures are as of then (the last window's end)
