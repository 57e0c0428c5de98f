"""Dashboards, alert and fleet recording rules against a real Prometheus scraping two real daemons.

Prometheus (Debian's package) runs on loopback with a 1 s scrape and rule
interval, scraping a daemon that observes real TCG guests: two gang-managed
ones (so switch, latency and costop series exist) and one whose annotation
is invalid; and a second daemon, in ``--dry-run`` (it changes nothing),
watching the same guests as a second host would. Every PromQL expression of
every dashboard panel (the fleet one reads the recording rules), with
Grafana's variables filled in, must return data, and every rule must
evaluate without error; the invalid guest's policy-error alert must be
pending.
"""
from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from testbed import guests
from testbed.daemon import DaemonProcess, free_port

from .conftest import PREFIX

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARDS = sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))
RULES = DEPLOY / "prometheus" / "cosched-alerts.yml"
FLEET = DEPLOY / "prometheus" / "cosched-fleet-rules.yml"


class Prometheus:
    def __init__(self, tmp: Path, targets: list[str]):
        self.port = free_port()
        fleet = tmp / "cosched-fleet-rules.yml"           # evaluated every second here, not every 30
        fleet.write_text(FLEET.read_text().replace("interval: 30s", "interval: 1s"))
        config = tmp / "prometheus.yml"
        config.write_text(json.dumps({   # JSON is YAML
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES), str(fleet)],
            "scrape_configs": [{"job_name": "cosched", "static_configs": [{"targets": targets}]}],
        }))
        self.log = open(tmp / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def get(self, path: str, **params) -> dict:
        url = f"http://127.0.0.1:{self.port}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2):
                    return
            except OSError:
                time.sleep(0.3)
        raise TimeoutError(Path(self.log.name).read_text())

    def query(self, expr: str) -> list:
        r = self.get("/api/v1/query", query=expr)
        assert r["status"] == "success", (expr, r)
        return r["data"]["result"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory, libvirtd, guest_image):
    tmp = tmp_path_factory.mktemp("prometheus")
    d = DaemonProcess(tmp).start()
    (tmp / "second").mkdir()
    second = DaemonProcess(tmp / "second").start("--dry-run")
    started = []
    prom = None
    try:
        gang = guests.annotation("gang")
        for i in range(2):
            started.append(guests.start(f"{PREFIX}prom-{i}", workload="barrier", policy=gang, image=guest_image))
        started.append(guests.start(f"{PREFIX}prom-bad", workload="idle", image=guest_image,
                                    policy=guests.annotation("gang", quantum_ms="0")))
        names = [g.name for g in started]
        d.wait(lambda: all((x := d.domain(n)) and x["managed"] for n in names[:2]), 30, "gang guests managed")
        d.wait(lambda: (x := d.domain(names[2])) and x["error"], 10, "invalid annotation reported")
        second.wait(lambda: all(second.domain(n) for n in names), 30, "the second daemon sees the guests")
        prom = Prometheus(tmp, [f"127.0.0.1:{d.port}", f"127.0.0.1:{second.port}"])
        prom.wait_ready()
        # enough scrapes for 10 s rate windows, and for rule evaluations
        d.wait(lambda: (r := prom.query("count_over_time(cosched_build_info[15s])")) and len(r) == 2
               and min(float(x["value"][1]) for x in r) >= 12, 60, "12 scrapes of both daemons in Prometheus")
        yield prom, d, names
    finally:
        if prom:
            prom.stop()
        for g in started:
            g.destroy()
        assert second.stop() == 0
        assert d.stop() == 0


def fill(expr: str, instance: str, domain: str) -> str:
    """Grafana's variables as a dashboard with this host and guest selected would send them."""
    return (expr.replace("$instance", instance).replace("$domain", domain).replace("$job", "cosched")
            .replace("$__rate_interval", "10s").replace("$__range", "30s"))


def test_every_dashboard_query_returns_data(stack):
    prom, d, names = stack
    instance = f"127.0.0.1:{d.port}"
    empty, checked = [], 0
    for path in DASHBOARDS:
        dash = json.loads(path.read_text())
        # a multi-select "All" is the regex .*; the guest dashboard shows one managed guest
        domain = names[0] if dash["uid"] == "cosched-guest" else ".*"
        for panel in dash["panels"]:
            for target in panel["targets"]:
                checked += 1
                if not prom.query(fill(target["expr"], instance, domain)):
                    empty.append(f"{path.name} / {panel['title']}: {target['expr']}")
        for note in dash.get("annotations", {}).get("list", []):      # valid queries, data or not
            if "expr" in note:
                checked += 1
                prom.get("/api/v1/query", query=fill(note["expr"], instance, domain))
        uids = {json.loads(p.read_text())["uid"] for p in DASHBOARDS}
        for panel in dash["panels"]:                                # drill-down links lead somewhere
            for link in panel.get("fieldConfig", {}).get("defaults", {}).get("links", []):
                assert link["url"].split("/")[2] in uids, link
        for var in dash["templating"]["list"]:
            if var["type"] == "query":
                selector = var["query"]["query"].removeprefix("label_values(").rsplit(",", 1)[0]
                series = prom.get("/api/v1/series", **{"match[]": fill(selector, instance, domain)})["data"]
                if not series:
                    empty.append(f"{path.name} / variable {var['name']}: {selector}")
    assert checked >= 20
    assert not empty, "queries without data:\n" + "\n".join(empty)


def test_every_rule_evaluates_and_the_policy_error_is_pending(stack):
    prom, d, names = stack
    deadline = time.monotonic() + 15
    while True:
        rules = [r for g in prom.get("/api/v1/rules")["data"]["groups"] for r in g["rules"]]
        if rules and all(r.get("lastEvaluation", "").startswith("2") and r["health"] != "unknown" for r in rules):
            break
        assert time.monotonic() < deadline, rules
        time.sleep(0.5)
    assert len([r for r in rules if r["type"] == "alerting"]) == 15 and len(rules) == 15 + 9
    bad = {r["name"]: (r["health"], r.get("lastError")) for r in rules if r["health"] != "ok"}
    assert not bad, bad
    policy = next(r for r in rules if r["name"] == "CoschedGuestPolicyError")
    assert {a["labels"]["domain"] for a in policy["alerts"]} == {names[2]} and len(policy["alerts"]) == 2
    assert {a["state"] for a in policy["alerts"]} == {"pending"}          # for: 5m
    # its runbook link, as Prometheus expands it, opens the daemon's own runbook at the alert's entry
    for alert in policy["alerts"]:
        url = alert["annotations"]["runbook_url"]
        assert url == f"http://{alert['labels']['instance']}/runbook#coschedguestpolicyerror", url
        with urllib.request.urlopen(url.partition("#")[0], timeout=5) as r:
            assert r.headers["Content-Type"].startswith("text/html") and \
                '<a id="coschedguestpolicyerror">' in r.read().decode()
    down = next(r for r in rules if r["name"] == "CoschedDown")
    assert down["alerts"] == []
    # a healthy daemon: its health series exist, with healthy values, and their alerts are quiet
    for name, value in (("cosched_libvirt_connected", "1"), ("cosched_healthy", "1"), ("cosched_preset_errors", "0"),
                        ("cosched_switcher_realtime", "1"), ("cosched_deadline_admission_wrong", "0"),
                        ("cosched_rt_runtime_stranded_seconds_total", "0"), ("cosched_journal_damaged_lines", "0")):
        result = prom.get("/api/v1/query", query=f'{name}{{instance="127.0.0.1:{d.port}"}}')["data"]["result"]
        assert [r["value"][1] for r in result] == [value], (name, result)
    for quiet in ("CoschedLibvirtDisconnected", "CoschedUnhealthy", "CoschedPresetErrors", "CoschedSwitcherNotRealtime",
                  "CoschedDeadlineAdmissionWrong", "CoschedRtRuntimeStranded", "CoschedJournalDamaged", "CoschedErrors"):
        assert next(r for r in rules if r["name"] == quiet)["alerts"] == [], quiet
