import pytest
from prometheus_client import CollectorRegistry, generate_latest

from cosched.discovery import build_snapshot
from cosched.discovery.libvirt import DomainFacts
from cosched.metrics import CoschedCollector
from cosched.policy.presets import Presets
from cosched.sampler import Sampler

UUID = "11111111-2222-3333-4444-555555555555"
BAD = """<domain><metadata><cosched:policy xmlns:cosched="urn:cosched:libvirt:1" name="gang" bogus="1"/>
</metadata></domain>"""


def scrape(fake, fs):
    fake.qemu(100, "vm1", UUID, {0: 101, 1: 102})
    fake.qemu(200, "vm2", UUID.replace("1", "2"), {0: 201})
    snap = build_snapshot(fs, [DomainFacts("vm1", UUID, "<domain/>"), DomainFacts("vm2", UUID.replace("1", "2"), BAD)],
                          Presets.load([]), "gang")
    s = Sampler(fs, 0.01, lambda: snap)
    s.step(now_ns=0)
    fake.schedstat(100, 101, 2_500_000_000, 500_000_000)
    s.step(now_ns=3_000_000_000)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CoschedCollector(lambda: snap, s.view))
    return generate_latest(registry).decode()


def test_contract_metric_names_and_labels(fake, fs):
    text = scrape(fake, fs)
    for line in [
        'cosched_build_info{version="0.1.0"} 1.0',
        f'cosched_domain_info{{domain="vm1",policy="gang",uuid="{UUID}"}} 1.0',
        'cosched_domain_policy_error{domain="vm1"} 0.0',
        'cosched_domain_policy_error{domain="vm2"} 1.0',
        'cosched_vcpu_run_seconds_total{domain="vm1",vcpu="0"} 2.5',
        'cosched_vcpu_wait_seconds_total{domain="vm1",vcpu="0"} 0.5',
        'cosched_domain_skew_seconds_count{domain="vm1"} 1.0',
    ]:
        assert line in text, line
    assert "# TYPE cosched_domain_concurrency_hazard_seconds_total counter" in text
    assert "# TYPE cosched_domain_partial_contention_seconds_total counter" in text
    assert "# TYPE cosched_domain_skew_seconds histogram" in text
    assert "tid" not in text and "pid" not in text


def test_a_domains_figures_say_when_its_last_window_ended(fake, fs):
    """The end of the last window counted, as Unix time: the scrape reads
    figures as of then (here a window that ended at monotonic 3 s)."""
    import time
    text = scrape(fake, fs)
    (line,) = [x for x in text.splitlines() if x.startswith('cosched_domain_observed_timestamp_seconds{domain="vm1"}')]
    ended = float(line.split()[-1])
    assert ended == pytest.approx(time.time() - (time.monotonic() - 3.0), abs=0.5)


def test_host_wide_side_effects_are_metrics():
    """RT runtime stranded in removed cgroups and a deadline admission total
    cosched could not recount, from the switcher's reports as the engine
    accumulates them."""
    from cosched.switcher.protocol import Stats

    class Engine:
        plan = None

        def stats(self):
            return Stats(rt_stranded_us=300_000, admission_wrong=True, error_count=7, journal_damage=2)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(CoschedCollector(lambda: None, dict, Engine()))
    text = generate_latest(registry).decode()
    assert "cosched_rt_runtime_stranded_seconds_total 0.3" in text
    assert "cosched_deadline_admission_wrong 1.0" in text
    assert "cosched_errors_total 7.0" in text and "cosched_journal_damaged_lines 2.0" in text


def test_metrics_are_served_over_http_and_the_server_stops():
    """The server is built from what prometheus-client has had since Debian
    12's 0.16 (``make_wsgi_app``), in a thread of its own."""
    import urllib.request

    import urllib.error

    from cosched.metrics import serve
    health = {"libvirt_connected": True, "samples": 7, "late_samples": 0, "sample_period": 0.01, "preset_errors": 0,
              "switcher_realtime": True, "healthy": True, "observation": "proc"}
    server, _ = serve(CoschedCollector(lambda: None, dict, health=lambda: health), "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
            text = r.read().decode()
        assert 'cosched_build_info{version="' in text and "process_cpu_seconds_total" in text
        with urllib.request.urlopen(f"{url}/healthz", timeout=5) as r:
            assert r.status == 200 and r.read() == b"ok\n"
        with urllib.request.urlopen(f"{url}/runbook", timeout=5) as r:   # what the alert rules link to
            assert r.status == 200 and '<a id="coscheddown"></a>## CoschedDown' in r.read().decode()
        health["healthy"] = False                       # a worker died: the probe fails, /metrics still answers
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{url}/healthz", timeout=5)
        assert e.value.code == 503
    finally:
        server.shutdown()
        server.server_close()
