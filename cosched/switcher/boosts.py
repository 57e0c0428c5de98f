"""How big a boost is, and how often a vCPU may have one.

A watched boost is SCHED_DEADLINE: ``boost_ms`` and a margin of runtime in a
period that holds it to a share of a CPU, so that the kernel caps it even if
cosched stops answering. Within that period a long wait takes a SCHED_FIFO
boost instead, within the RT runtime its cgroup was granted.
"""
from __future__ import annotations

from cosched.actuators.sched import SchedAttr
from cosched.hostfs import HostFS
from cosched.policy.plan import Member
from cosched.switcher.timing import WATCH_POLL_NS

BOOST_MARGIN_NS = 2_000_000
MAX_SHARE = 0.5               # of a CPU, per boost (boost_share)
FAIR_SERVER_SHARE = 0.05      # the deadline server that keeps CFS tasks running (Linux 6.12+: 50 ms per second per CPU)


def boost_attr(boost_ms: float, share: float = MAX_SHARE) -> SchedAttr:
    """The attributes of a watched deadline boost: ``boost_ms`` of runtime
    plus :data:`BOOST_MARGIN_NS`, in a period that holds it to ``share`` of a
    CPU (the kernel enforces it even if cosched stops answering). Why these
    figures: ``docs/design/switcher.md`` (*The boost*)."""
    runtime = int(boost_ms * 1_000_000) + BOOST_MARGIN_NS
    period = int(runtime / share)
    return SchedAttr("deadline", runtime_ns=runtime, deadline_ns=period, period_ns=period)


FALLBACK_BOOST = SchedAttr("fifo", priority=1)
FIFO_BUDGET_SHARE = 0.9      # of a vCPU's RT runtime, for its SCHED_FIFO boosts within deadline boosts' periods


def rt_granted(m: Member) -> bool:
    """Whether the plan grants RT runtime to this member's vCPU cgroups
    (RT group scheduling kernels)."""
    return bool(m.rt_vcpu_us) and any(v.rt_chain for v in m.vcpus)


def fifo_budget_ns(m: Member) -> int | None:
    """The time a ``boost`` guest's vCPU may spend in SCHED_FIFO boosts per
    RT period (:class:`cosched.policy.watch.BoostRules`): nine tenths of the RT
    runtime granted to its cgroup on kernels with RT group scheduling,
    past which the kernel throttles it: a sampler of the kernel's RT run
    queues, every 0.1 s, found a vCPU group throttled in 31 samples of a
    run of every workload without this bound, in none of two runs with it
    (``docs/decisions/0011-fifo-boosts-within-a-deadline-period.md``). No bound elsewhere."""
    return int(m.rt_vcpu_us * 1000 * FIFO_BUDGET_SHARE) if rt_granted(m) else None


def fresh_ns(boost_ms: float, share: float) -> int:
    """How long after a boost took effect (the clock read once the call
    returned) its vCPU may be boosted afresh (:func:`boost_attr`): the
    reservation's period, by then over, and a poll to spare. Counted from
    before the call instead, a boost can come microseconds before the last
    one's deadline, inherit it, outlive it and so leave through the zero
    reservation with its deadline passed: the test of forty boosts
    (``tests/kernel/test_sched.py``) counted so failed twice in 18 runs, once
    with a boost that waited 4.2 s (none in 25 runs since)."""
    return boost_attr(boost_ms, share).period_ns + WATCH_POLL_NS


def boost_share(fs: HostFS) -> float:
    """The share of a CPU each boost holds: nine tenths of what the kernel's
    deadline admission allows per CPU (``sched_rt_runtime_us`` per
    ``sched_rt_period_us``, 95% by default, less the fair server's 5% on
    kernels from 6.12), at most :data:`MAX_SHARE`. No more boosts run at
    once than the pool has CPUs, and a boost's bandwidth leaves the
    admission total as the boost ends (the zero reservation), so that much
    is always admitted. Half a CPU at most: a vCPU boosted when its switcher
    is killed keeps its reservation until the daemon restores it, and takes
    no more than that meanwhile; and the period, which sets the least time
    between two boosts of a vCPU, is then twice the boost."""
    runtime = (fs.read_or("/proc/sys/kernel/sched_rt_runtime_us") or "").strip()
    period = (fs.read_or("/proc/sys/kernel/sched_rt_period_us") or "").strip()
    limit = 1.0 if runtime == "-1" else (int(runtime) / int(period) if runtime.isdigit() and period.isdigit()
                                         and int(period) else 0.95)
    return max(min(MAX_SHARE, 0.9 * (limit - FAIR_SERVER_SHARE)), 0.01)
