"""Every file in deploy/ checked by the tools that will read it.

The unit by ``systemd-analyze verify``, the alert rules by ``promtool check
rules`` and ``promtool test rules``, the dashboards and provisioning files by
their structure (tests/integration/test_prometheus.py then runs every
dashboard query and alert rule against a real Prometheus), the Kubernetes
DaemonSet by ``kubernetes-validate`` against the Kubernetes API schema. The
tools come from Debian's systemd and prometheus packages and PyPI, which
``make test`` installs. The container build files are built nowhere here
(these machines run no container engine).
"""
from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARDS = sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))
UNIT = DEPLOY / "systemd" / "cosched.service"


def run(*cmd, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)


def unit_options(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            key, value = line.split("=", 1)
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def test_unit_verifies(tmp_path):
    # verify checks that ExecStart's binary exists: point it at this checkout's command
    cosched = Path(sys.executable).parent / "cosched"
    unit = tmp_path / "cosched.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/cosched", str(cosched)))
    # and that Documentation='s man page exists: this checkout's
    (tmp_path / "man" / "man8").mkdir(parents=True)
    (tmp_path / "man" / "man8" / "cosched.8").write_text((DEPLOY.parent / "docs" / "cosched.8").read_text())
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True,
                       env={**os.environ, "MANPATH": str(tmp_path / "man")})
    assert r.returncode == 0 and "cosched.service" not in r.stderr, r.stderr


def test_unit_is_a_watched_notify_service_that_resets_after_any_exit():
    opts = unit_options(UNIT.read_text())
    assert opts["Type"] == ["notify"] and opts["Restart"] == ["on-failure"]
    assert opts["WatchdogSec"] and opts["ExecStopPost"][0].split()[1:2] == ["reset"]
    assert any("libvirtd.service" in a and "virtqemud.service" in a for a in opts["After"])
    # hardening must leave cgroup writes and realtime scheduling possible
    for forbidden in ("ProtectControlGroups", "RestrictRealtime", "ProtectKernelTunables"):
        assert forbidden not in opts, forbidden
    assert "CAP_SYS_NICE" in opts["CapabilityBoundingSet"][0]


def test_unit_never_pulls_in_a_libvirt_daemon():
    """virtqemud.service has Conflicts=libvirtd.service: wanting libvirtd would stop virtqemud."""
    opts = unit_options(UNIT.read_text())
    for key in ("Wants", "Requires", "Requisite", "BindsTo", "PartOf"):
        assert key not in opts, key
    assert {"libvirtd.socket", "virtqemud.socket"} <= set(" ".join(opts["After"]).split())


def test_unit_hardening_scores_better_than_before(tmp_path):
    opts = unit_options(UNIT.read_text())
    assert opts["ProtectSystem"] == ["strict"] and opts["UMask"] == ["0077"]
    assert opts["SystemCallFilter"][0] == "@system-service"
    unit = tmp_path / "cosched.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/cosched", "/bin/true"))
    r = run("systemd-analyze", "security", "--offline=yes", str(unit))
    score = re.search(r"Overall exposure level for cosched.service: ([0-9.]+)", r.stdout)
    assert score, r.stdout + r.stderr
    assert float(score.group(1)) <= 3.5, r.stdout      # 4.7 before ProtectSystem=strict, the filter and UMask


def test_every_alert_links_to_its_entry_in_the_runbook_the_daemon_serves():
    from cosched import runbook
    rules = yaml.safe_load((DEPLOY / "prometheus" / "cosched-alerts.yml").read_text())
    text = runbook.text()                         # the package's copy, what /runbook serves
    assert text == (DEPLOY.parent / "docs" / "runbook.md").read_text()
    anchors = {runbook.anchor(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}
    alerts = [r for g in rules["groups"] for r in g["rules"]]
    assert len(alerts) == 15
    for rule in alerts:
        url = rule["annotations"]["runbook_url"]
        base, _, fragment = url.partition("#")
        assert base in ("http://{{ $labels.instance }}/runbook",
                        "{{ with $labels.instance }}http://{{ . }}/runbook{{ end }}"), url
        assert fragment == runbook.anchor(rule["alert"]) and fragment in anchors, \
            f"{rule['alert']}: the runbook has no heading for {url}"
    page = runbook.page(text).decode()
    assert all(f'<a id="{a}"></a>' in page for a in anchors)


def test_make_rules_links_every_alert_to_the_runbook_url_an_operator_sets(tmp_path):
    r = run("make", "-s", "-C", str(DEPLOY.parent), "rules", f"RULES_DIR={tmp_path}",
            "RUNBOOK_URL=https://runbook.example/cosched.html")
    assert r.returncode == 0, r.stdout + r.stderr
    rules = yaml.safe_load((tmp_path / "cosched-alerts.yml").read_text())
    for rule in (r for g in rules["groups"] for r in g["rules"]):
        assert rule["annotations"]["runbook_url"] == "https://runbook.example/cosched.html#" + rule["alert"].lower()
    r = run("promtool", "check", "rules", "cosched-alerts.yml", cwd=tmp_path)
    assert r.returncode == 0 and "SUCCESS: 15 rules found" in r.stdout, r.stdout + r.stderr


def test_alert_rules_check_and_unit_tests_pass():
    prom = DEPLOY / "prometheus"
    r = run("promtool", "check", "rules", "cosched-alerts.yml", cwd=prom)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 15 rules found" in r.stdout
    r = run("promtool", "check", "rules", "cosched-fleet-rules.yml", cwd=prom)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 9 rules found" in r.stdout
    r = run("promtool", "test", "rules", "cosched-alerts.test.yml", cwd=prom)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_has_a_test():
    rules = yaml.safe_load((DEPLOY / "prometheus" / "cosched-alerts.yml").read_text())
    names = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    tests = yaml.safe_load((DEPLOY / "prometheus" / "cosched-alerts.test.yml").read_text())
    tested = {t["alertname"] for case in tests["tests"] for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert names == tested


def test_scrape_snippet_names_the_job_and_the_rules():
    cfg = yaml.safe_load((DEPLOY / "prometheus" / "scrape-cosched.yml").read_text())
    assert [j["job_name"] for j in cfg["scrape_configs"]] == ["cosched"]      # CoschedDown matches job="cosched"
    assert cfg["rule_files"][0].endswith("cosched-alerts.yml")
    assert cfg["rule_files"][1].endswith("cosched-fleet-rules.yml")


def test_the_federation_example_takes_the_recording_rules_and_the_daemons_health():
    cfg = yaml.safe_load((DEPLOY / "prometheus" / "federate-cosched.yml").read_text())
    (job,) = cfg["scrape_configs"]
    assert job["metrics_path"] == "/federate" and job["honor_labels"] is True
    matches = job["params"]["match[]"]
    rules = yaml.safe_load((DEPLOY / "prometheus" / "cosched-fleet-rules.yml").read_text())
    recorded = [r["record"] for g in rules["groups"] for r in g["rules"]]
    assert all(name.startswith("cosched:") for name in recorded) and any("cosched:.*" in m for m in matches)
    fleet = json.loads((DEPLOY / "grafana" / "dashboards" / "cosched-fleet.json").read_text())
    used = set(re.findall(r"cosched:[a-z_:0-9]+", " ".join(t["expr"] for p in fleet["panels"] for t in p["targets"])))
    assert used and used <= set(recorded), used - set(recorded)


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_shape(path):
    text = path.read_text()
    d = json.loads(text)
    assert d["uid"] in ("cosched-host", "cosched-guest", "cosched-fleet") and "${DS_" not in text
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    if d["uid"] != "cosched-fleet":                         # the fleet is every host at once
        assert "domain" in variables and "instance" in variables and "job" in variables
        assert "$job" in variables["instance"]["query"]["query"]
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"] and all(t["expr"] and t["datasource"]["uid"] == "${datasource}" for t in p["targets"])
        for t in p["targets"]:
            names = set(re.findall(r"\b(cosched_[a-z_]+|cosched:[a-z_:0-9]+|process_[a-z_]+|up(?=\{job=(?:\"cosched\"|~\"\$job\")))",
                                   t["expr"]))
            assert names, t["expr"]


def test_dashboards_cover_the_metrics_that_matter():
    exprs = " ".join(t["expr"] for path in DASHBOARDS for p in json.loads(path.read_text())["panels"] for t in p["targets"])
    for metric in ("cosched_domain_mode", "cosched_vcpu_boosts_total", "cosched_vcpu_costops_total",
                   "cosched_forced_thaws_total", "cosched_observation", "cosched_healthy",
                   "cosched_domain_info", "cosched_domain_policy_error", "cosched_vcpu_run_seconds_total",
                   "cosched_vcpu_wait_seconds_total", "cosched_vcpu_costop_seconds_total",
                   "cosched_domain_concurrency_hazard_seconds_total", "cosched_domain_skew_seconds_bucket",
                   "cosched_switches_total", "cosched_switch_latency_seconds_bucket"):
        assert metric in exprs, metric


def test_grafana_provisioning():
    ds = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "cosched-prometheus.yaml").read_text())
    assert ds["apiVersion"] == 1 and ds["datasources"][0]["type"] == "prometheus"
    dash = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "dashboards" / "cosched.yaml").read_text())
    (provider,) = dash["providers"]
    assert provider["type"] == "file"
    # where `make install` puts the dashboards (its default SHAREDIR)
    makefile = (DEPLOY.parent / "Makefile").read_text()
    assert "PREFIX ?= /usr/local" in makefile and "SHAREDIR ?= $(PREFIX)/share/cosched" in makefile
    assert provider["options"]["path"] == "/usr/local/share/cosched/grafana/dashboards"


def test_the_daemonset_validates_against_the_kubernetes_schema():
    import kubernetes_validate
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "cosched-daemonset.yaml").read_text()))
    assert [d["kind"] for d in docs] == ["Namespace", "ConfigMap", "DaemonSet"]
    version = kubernetes_validate.latest_version()
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)
    ds = docs[2]["spec"]["template"]["spec"]
    assert ds["hostPID"] and ds["containers"][0]["securityContext"]["privileged"]
    config = docs[1]["data"]["cosched.toml"]
    from cosched.config import from_dict
    from cosched.compat import tomllib
    assert from_dict(tomllib.loads(config)).sources == ("processes",)


def test_the_pod_monitor_scrapes_the_daemonset_s_pods_as_job_cosched():
    """The Prometheus Operator's PodMonitor (a CRD, so no schema here): it
    selects the DaemonSet's pods, names their port, and gives the job label
    the alerts and dashboards expect."""
    (monitor,) = yaml.safe_load_all((DEPLOY / "kubernetes" / "cosched-podmonitor.yaml").read_text())
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "cosched-daemonset.yaml").read_text()))
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    assert monitor["metadata"]["namespace"] == ds["metadata"]["namespace"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} <= ports
    assert pod["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "cosched"
    assert pod["spec"]["containers"][0]["livenessProbe"]["httpGet"]["path"] == "/healthz"


def _subcommands() -> set[str]:
    import argparse

    from cosched.cli import parser
    (sub,) = [a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return set(sub.choices)


def test_the_man_page_renders_cleanly_and_names_every_command():
    page = DEPLOY.parent / "docs" / "cosched.8"
    r = subprocess.run(["man", "--warnings", "-l", str(page)], capture_output=True, text=True,
                       env={**os.environ, "MANWIDTH": "80", "MANPAGER": "cat", "LC_ALL": "C.UTF-8"})
    assert r.returncode == 0 and r.stderr == "", r.stderr
    synopsis = " ".join(r.stdout.split("DESCRIPTION")[0].split())
    assert {c for c in _subcommands() if f"cosched {c}" in synopsis} == _subcommands(), synopsis
    from cosched import __version__
    assert f"cosched {__version__}" in page.read_text()


def test_bash_completion_offers_every_command_and_their_options():
    script = DEPLOY / "bash-completion" / "cosched"
    probe = f"""
source {script}
_cosched_guests() {{ echo vm-one vm-two; }}
line() {{ COMP_WORDS=("$@"); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); _cosched; echo "${{COMPREPLY[*]}}"; }}
line cosched ''
line cosched status vm-t
line cosched policy --c
"""
    r = subprocess.run(["bash", "-c", probe], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    commands, guest, option = r.stdout.splitlines()
    assert _subcommands() <= set(commands.split())
    assert (guest, option) == ("vm-two", "--config --clear")
