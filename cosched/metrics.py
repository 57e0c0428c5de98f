"""Prometheus metrics: a custom collector on a private registry.

Each scrape reads the current snapshot and the sampler's accumulated figures;
nothing is stored twice. Names and labels are a contract (docs/reference/metrics.md, dashboards
and alerts depend on them): seconds, never nanoseconds, and no TID or PID
labels. A domain's series disappear with the domain.
"""
from __future__ import annotations

import socket
import threading
import time
from socketserver import ThreadingMixIn
from typing import Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from cosched import __version__, runbook
from cosched.trust import REASONS
from cosched.model import Snapshot
from cosched.sampler import DomainView


class CoschedCollector:
    def __init__(self, snapshot: Callable[[], Snapshot | None], sampler_view: Callable[[], dict[str, DomainView]],
                 engine=None, health: Callable[[], dict] | None = None,
                 modes: Callable[[], dict[str, str]] = dict):
        self.snapshot = snapshot
        self.sampler_view = sampler_view
        self.engine = engine
        self.health = health
        self.modes = modes

    def describe(self):
        return []  # dynamic series: do not let the registry call collect() at registration

    def collect(self):
        snap = self.snapshot()
        views = self.sampler_view()
        build = GaugeMetricFamily("cosched_build_info", "cosched version", labels=["version"])
        build.add_metric([__version__], 1)
        yield build

        info = GaugeMetricFamily("cosched_domain_info", "One series per observed domain", labels=["domain", "uuid", "policy"])
        error = GaugeMetricFamily("cosched_domain_policy_error", "1 while the domain's annotation is invalid", labels=["domain"])
        run = CounterMetricFamily("cosched_vcpu_run_seconds", "Time the vCPU thread ran on a host CPU", labels=["domain", "vcpu"])
        wait = CounterMetricFamily("cosched_vcpu_wait_seconds", "Time the vCPU thread was runnable but waiting for a host CPU", labels=["domain", "vcpu"])
        hazard = CounterMetricFamily(
            "cosched_domain_concurrency_hazard_seconds",
            "Time at least one vCPU ran while at least one sibling was runnable but waiting (estimated)",
            labels=["domain"],
        )
        partial = CounterMetricFamily(
            "cosched_domain_partial_contention_seconds",
            "Time at least one vCPU waited while no sibling ran (estimated)",
            labels=["domain"],
        )
        observed = CounterMetricFamily(
            "cosched_domain_observed_seconds",
            "Time covered by sampling windows (denominator for hazard and contention fractions)",
            labels=["domain"],
        )
        until = GaugeMetricFamily(
            "cosched_domain_observed_timestamp_seconds",
            "Unix time at which the domain's last sampling window ended: its counters are as of then",
            labels=["domain"],
        )
        skew = HistogramMetricFamily(
            "cosched_domain_skew_seconds",
            "Per sampling window: largest difference between two sibling vCPUs' lag (wait + costop)",
            labels=["domain"],
        )
        costop = CounterMetricFamily("cosched_vcpu_costop_seconds", "Time the vCPU was held frozen by cosched",
                                     labels=["domain", "vcpu"])
        costops = CounterMetricFamily("cosched_vcpu_costops", "Times cosched co-stopped this vCPU alone (relaxed)",
                                      labels=["domain", "vcpu"])
        boosts = CounterMetricFamily("cosched_vcpu_boosts", "Times cosched boosted this vCPU (boost, relaxed)",
                                     labels=["domain", "vcpu"])
        mode = GaugeMetricFamily("cosched_domain_mode", "1 for the mode in force for a managed domain",
                                 labels=["domain", "mode"])
        plan = self.engine.plan if self.engine is not None else None
        rejected = plan.rejected if plan else {}
        stats = self.engine.stats() if self.engine is not None else None
        modes = self.modes()
        monotonic_to_unix = time.time() - time.monotonic()
        for d in snap.domains if snap else ():
            info.add_metric([d.name, d.uuid, d.policy.preset if d.policy else ""], 1)
            error.add_metric([d.name], 1 if d.error or d.uuid in rejected else 0)
            if d.uuid in modes:
                mode.add_metric([d.name, modes[d.uuid]], 1)
            if plan is not None and plan.cell_of(d.uuid):
                for vc in d.vcpus:
                    key, labels = (d.uuid, vc.index), [d.name, str(vc.index)]
                    costop.add_metric(labels, stats.costop.get(key, 0.0))
                    costops.add_metric(labels, stats.costops.get(key, 0))
                    boosts.add_metric(labels, stats.boosts.get(key, 0))
            v = views.get(d.uuid)
            if v is None:
                continue
            for vc in v.vcpus:
                run.add_metric([d.name, str(vc.index)], vc.run)
                wait.add_metric([d.name, str(vc.index)], vc.wait)
            hazard.add_metric([d.name], v.hazard)
            partial.add_metric([d.name], v.partial)
            observed.add_metric([d.name], v.observed)
            if v.until is not None:
                until.add_metric([d.name], v.until + monotonic_to_unix)
            skew.add_metric([d.name], [(le, c) for le, c in v.skew_buckets], v.skew_sum)
        yield from (info, error, run, wait, costop, costops, boosts, mode, hazard, partial, observed, until, skew)
        if stats is not None:
            yield from self._engine_metrics(stats)
        if self.health is not None:
            yield from self._health_metrics(self.health())

    @staticmethod
    def _health_metrics(h: dict):
        """The daemon's own health: what alerts need to tell a sick daemon from a quiet host."""
        connected = GaugeMetricFamily("cosched_libvirt_connected", "1 while the libvirt connection is up")
        connected.add_metric([], 1 if h["libvirt_connected"] else 0)
        samples = CounterMetricFamily("cosched_samples", "Sampling passes over every vCPU")
        samples.add_metric([], h["samples"])
        late = CounterMetricFamily("cosched_late_samples", "Sampling passes that started over one interval late")
        late.add_metric([], h["late_samples"])
        period = GaugeMetricFamily("cosched_sample_period_seconds",
                                   "Sampling period in force: sample_interval_ms, or longer to stay within "
                                   "sample_budget_pct on a host with many vCPUs")
        period.add_metric([], h["sample_period"])
        presets = GaugeMetricFamily("cosched_preset_errors", "Preset files that failed to load (see the log)")
        presets.add_metric([], h["preset_errors"])
        realtime = GaugeMetricFamily(
            "cosched_switcher_realtime",
            "1 when the switcher runs SCHED_FIFO, 0 when it could not (slots may be late, no boosts), "
            "absent before it first started")
        if h["switcher_realtime"] is not None:
            realtime.add_metric([], 1 if h["switcher_realtime"] else 0)
        healthy = GaugeMetricFamily("cosched_healthy",
                                    "1 while the sampler and discovery threads run and sample (the watchdog is fed)")
        healthy.add_metric([], 1 if h["healthy"] else 0)
        ignored = GaugeMetricFamily(
            "cosched_ignored_processes",
            "QEMU-named processes the processes source does not manage, by why: executable (not a configured "
            "emulator), file (not root's, or writable by others), user (not root or an emulator user)",
            labels=["reason"])
        for reason in REASONS:
            ignored.add_metric([reason], h.get("ignored_processes", {}).get(reason, 0))
        observation = GaugeMetricFamily(
            "cosched_observation", "1 for the source of the vCPU figures: meter (in-kernel) or proc (/proc sampling)",
            labels=["source"])
        if h.get("observation"):
            observation.add_metric([h["observation"]], 1)
        yield from (connected, samples, late, period, presets, realtime, healthy, ignored, observation)

    @staticmethod
    def _engine_metrics(s):
        switches = CounterMetricFamily("cosched_switches", "Gang slot changes performed", labels=["cell"])
        for cell, n in sorted(s.switches.items()):
            switches.add_metric([cell], n)
        latency = HistogramMetricFamily(
            "cosched_switch_latency_seconds",
            "From the first freeze write of a slot change until every incoming vCPU is thawed",
            buckets=s.latency.buckets(), sum_value=s.latency.total)
        lateness = HistogramMetricFamily(
            "cosched_slot_lateness_seconds", "How late each slot change started after its deadline",
            buckets=s.lateness.buckets(), sum_value=s.lateness.total)
        forced = CounterMetricFamily("cosched_forced_thaws", "vCPUs thawed out of turn: held up to max_stall_ms, or left frozen by a stalled switcher")
        forced.add_metric([], s.forced_thaws)
        stranded = CounterMetricFamily(
            "cosched_rt_runtime_stranded_seconds",
            "RT runtime (per cpu.rt_period_us) cosched had granted to guest cgroups that were removed while "
            "they held it: the kernel counts it against their parent until it frees them (up to an hour)")
        stranded.add_metric([], s.rt_stranded_us / 1e6)
        admission = GaugeMetricFamily(
            "cosched_deadline_admission_wrong",
            "1 while the kernel's deadline admission total is wrong and cosched could not recount it "
            "(SCHED_DEADLINE requests on the host are refused)")
        admission.add_metric([], 1 if s.admission_wrong else 0)
        errors = CounterMetricFamily(
            "cosched_errors", "Problems the engine and its switcher reported (a write the kernel refused, a vCPU "
            "that would not freeze, a stalled switcher...): each in the log and the status' errors")
        errors.add_metric([], s.error_count)
        damage = GaugeMetricFamily(
            "cosched_journal_damaged_lines",
            "Lines of the state journal found damaged at start: originals that may be lost (see the log)")
        damage.add_metric([], s.journal_damage)
        yield from (switches, latency, lateness, forced, stranded, admission, errors, damage)


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format, *args):     # a scrape is not worth a log line
        pass


def _routes(metrics, collector: CoschedCollector):
    """``/healthz`` beside the metrics: 200 while the daemon's threads run and
    its sampler samples (what feeds systemd's watchdog), 503 otherwise; for
    a liveness probe that asks whether the daemon works, not whether it
    answers HTTP. And ``/runbook``, the page the alert rules link to."""
    def app(environ, start_response):
        if environ.get("PATH_INFO") == "/runbook":
            try:
                body = runbook.page(runbook.text())
            except OSError as e:
                start_response("404 Not Found", [("Content-Type", "text/plain")])
                return [f"the runbook is not installed with this daemon: {e}\n".encode()]
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [body]
        if environ.get("PATH_INFO") != "/healthz":
            return metrics(environ, start_response)
        healthy = collector.health is not None and collector.health().get("healthy", False)
        start_response("200 OK" if healthy else "503 Service Unavailable", [("Content-Type", "text/plain")])
        return [b"ok\n" if healthy else b"unhealthy: a worker thread died or the sampler stalled\n"]
    return app


def serve(collector: CoschedCollector, host: str, port: int):
    """Start the ``/metrics`` (and ``/healthz``, ``/runbook``) HTTP server on a private
    registry, in a thread of its own; return the server (``shutdown()``
    stops it) and the registry. Built from ``make_wsgi_app``, which every
    prometheus-client since Debian 12's 0.16 has, where
    ``start_http_server`` returns the server only from 0.20 on."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    ProcessCollector(registry=registry)   # process_cpu_seconds_total: the daemon's own overhead
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server_class = type("Server", (_Server,), {"address_family": family})
    server = make_server(host.strip("[]"), port, _routes(make_wsgi_app(registry), collector), server_class,
                         handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server, registry
