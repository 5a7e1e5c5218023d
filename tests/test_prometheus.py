"""Dashboards and alert rules checked against a real Prometheus scraping real Hoard nodes.

Every PromQL expression in ``config/grafana/dashboards/*.json`` and
``config/prometheus/alerts.yml`` goes through Prometheus's own parser and
evaluator (``/api/v1/query``) after a small workload through two Hoard
processes reading from moto; the panels that matter most must show data.
``promtool`` checks the rules and the config and runs unit tests of every
alert on synthetic series. The static checks at the top need no Prometheus:
every metric Hoard exports is shown by a panel, and no panel or rule names a
metric Hoard does not export unless it is listed below as one to come.

Prometheus is Debian's ``prometheus`` package (``scripts/test`` installs it
when apt is available); without the binary the live tests are skipped.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from gateway.obs.metrics import Metrics
from tests.conftest import ORIGIN_KEY, ORIGIN_SECRET
from tests.harness import REPO, HoardProcess, free_port

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
DASHBOARDS = sorted((REPO / "config/grafana/dashboards").glob("*.json"))
PROMETHEUS_YML = REPO / "config/prometheus/prometheus.yml"
ALERTS_YML = REPO / "config/prometheus/alerts.yml"
DATASOURCES = REPO / "config/grafana/provisioning/datasources/prometheus.yml"

# Metrics that panels or rules may name before Hoard exports them, and why.
# Each such panel says "Not exported yet" in its description.
FUTURE: dict[str, str] = {}
# Metrics with a mount label: their selectors filter by $mount.
PER_MOUNT = ("hoard_requests_total", "hoard_request_duration_seconds_bucket",
             "hoard_response_bytes_total", "hoard_bytes_served_total",
             "hoard_metadata_lookups_total")  # fmt: skip
# What Grafana would put in place of its variables. $job is the job_name of
# prometheus.yml, which the live test keeps; "All" of a multi-value variable is ".*".
VARIABLES = {
    "__rate_interval": "30s", "__interval": "1s", "__range": "5m",
    "job": "hoard", "node": ".*", "mount": ".*", "origin": ".*",
}  # fmt: skip
# (dashboard uid, panel title): panels that must show data after the workload.
CORE_PANELS = [
    ("hoard-overview", "Requests"),
    ("hoard-overview", "Hit ratio"),
    ("hoard-overview", "Hit ratio (bytes)"),
    ("hoard-overview", "Request rate by operation"),
    ("hoard-overview", "Bytes served by source"),
    ("hoard-overview", "Origin offload"),
    ("hoard-overview", "p50 latency by operation"),
    ("hoard-overview", "p99 latency by operation"),
    ("hoard-overview", "Hit ratio by mount (bytes)"),
    ("hoard-cache", "Bytes per tier vs limit"),
    ("hoard-cache", "Disk tier fill"),
    ("hoard-cache", "Metadata lookups by state"),
    ("hoard-cluster", "Members up"),
    ("hoard-cluster", "Requests per node"),
    ("hoard-cluster", "Memory per node"),
    ("hoard-cluster", "CPU per node"),
    ("hoard-origin", "Origin requests by operation"),
    ("hoard-origin", "Origin latency p99 by operation"),
    ("hoard-origin", "Origin bytes"),
]
DEADLINE = 60.0  # seconds for the whole live test


# ---------------------------------------------------------------- the files


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])  # panels inside a collapsed row


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(dashboard uid, panel title, PromQL) of every panel target."""
    found = []
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        for panel in panels(board):
            for target in panel.get("targets", []):
                found.append((board["uid"], panel["title"], target["expr"]))
    return found


def alert_rules() -> list[tuple[str, str]]:
    rules = yaml.safe_load(ALERTS_YML.read_text())
    return [(rule["alert"], rule["expr"]) for group in rules["groups"] for rule in group["rules"]]


def concrete(expr: str) -> str:
    """``expr`` with Grafana's variables replaced as Grafana would; unknown ones fail."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in VARIABLES, f"unknown dashboard variable ${name} in {expr!r}"
        return VARIABLES[name]

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", value, expr)


def variable_queries() -> dict[tuple[str, str], tuple[str, str]]:
    """(dashboard uid, variable) -> (label, series selector) of each label_values() variable."""
    found = {}
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        for var in board["templating"]["list"]:
            match = re.fullmatch(r"label_values\((.+), *(\w+)\)", var["definition"])
            assert match, (board["uid"], var["name"], var["definition"])
            assert var["query"]["query"] == var["definition"]
            found[board["uid"], var["name"]] = (match.group(2), match.group(1))
    return found


def exported_metrics() -> dict[str, str]:
    """Every series name Hoard can export -> the metric it belongs to."""
    names = {}
    for family in Metrics().registry.collect():
        if family.type == "counter":
            names[family.name + "_total"] = family.name + "_total"
        elif family.type == "histogram":
            for suffix in ("_bucket", "_count", "_sum"):
                names[family.name + suffix] = family.name
        else:
            names[family.name] = family.name
    return names


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(hoard_\w+|process_\w+|up)\b", expr))


def test_dashboards_are_provisionable():
    datasource = yaml.safe_load(DATASOURCES.read_text())["datasources"][0]
    assert datasource["type"] == "prometheus"
    uids = set()
    assert len(DASHBOARDS) == 4
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        assert board["uid"] not in uids
        uids.add(board["uid"])
        assert board["schemaVersion"] >= 39
        variables = {var["name"]: var for var in board["templating"]["list"]}
        assert {"node", "mount"} <= variables.keys(), path.name
        ids = [panel["id"] for panel in panels(board)]
        assert len(ids) == len(set(ids)), path.name
        titles = [panel["title"] for panel in panels(board)]
        assert len(titles) == len(set(titles)), path.name
        for panel in panels(board):
            grid = panel["gridPos"]
            assert grid["x"] + grid["w"] <= 24, panel["title"]
            for target in panel.get("targets", []):
                assert panel["datasource"]["uid"] == datasource["uid"], panel["title"]
                assert target["datasource"]["uid"] == datasource["uid"], panel["title"]
                # Every query follows the node picker; per-mount metrics follow $mount.
                expr = target["expr"]
                assert 'instance=~"$node"' in expr, (panel["title"], expr)
                for selector in re.findall(r"(hoard_\w+)\{([^}]*)\}", expr):
                    if selector[0] in PER_MOUNT:
                        assert 'mount=~"$mount"' in selector[1], (panel["title"], expr)
        for var in variables.values():
            assert var["datasource"]["uid"] == datasource["uid"]


def test_every_metric_is_on_a_dashboard_and_no_metric_is_invented():
    exported = exported_metrics()
    shown: dict[str, list[str]] = {}
    for uid, title, expr in dashboard_queries():
        for name in metric_names(expr):
            if name in FUTURE:
                continue
            assert name == "up" or name in exported, f"{uid} / {title} uses unknown {name}"
            shown.setdefault(exported.get(name, name), []).append(f"{uid} / {title}")
    missing = set(exported.values()) - shown.keys()
    assert not missing, f"metrics no panel shows: {sorted(missing)}"
    for alert, expr in alert_rules():
        for name in metric_names(expr):
            assert name == "up" or name in exported or name in FUTURE, f"{alert} uses {name}"


def test_panels_on_future_metrics_say_so():
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        for panel in panels(board):
            exprs = " ".join(target["expr"] for target in panel.get("targets", []))
            if metric_names(exprs) & FUTURE.keys():
                assert "Not exported yet" in panel["description"], panel["title"]


# ---------------------------------------------------------------- promtool


needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package 'prometheus')"
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@needs_promtool
def test_promtool_checks_rules_and_config():
    assert "7 rules found" in promtool("check", "rules", str(ALERTS_YML)).stdout
    promtool("check", "config", str(PROMETHEUS_YML))


def _series(name: str, values: str, **labels: str) -> dict[str, str]:
    text = ", ".join(f'{key}="{value}"' for key, value in {"job": "hoard", **labels}.items())
    return {"series": f"{name}{{{text}}}", "values": values}


def _fires(at: str, alert: str, *expected: dict[str, str]) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert,
            "exp_alerts": [{"exp_labels": labels} for labels in expected]}  # fmt: skip


@needs_promtool
def test_promtool_unit_tests_of_every_alert(tmp_path):
    """Each alert fires on the trouble it names and stays quiet on a healthy twin."""
    # Annotations are checked by `promtool check rules`; the unit tests check
    # expressions, durations and labels, so they run on a copy without them.
    rules = yaml.safe_load(ALERTS_YML.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(rules))
    a, b = {"instance": "a:9000"}, {"instance": "b:9000"}
    warn, crit = {"severity": "warning", "job": "hoard"}, {"severity": "critical", "job": "hoard"}
    mib = 1024 * 1024
    tests = [
        {  # node a stops answering at 6m; the alert fires after 2m.
            "input_series": [_series("up", "1x5 0x20", **a), _series("up", "1x25", **b)],
            "alert_rule_test": [
                _fires("7m", "HoardNodeDown"),
                _fires("10m", "HoardNodeDown", {**crit, **a}),
            ],
        },
        {  # 90 % of 10 MiB/min from the origin for an hour, against 1 % on a twin cluster.
            "input_series": [
                _series("hoard_bytes_served_total", f"0+{90 * mib}x60", source="origin", **a),
                _series("hoard_bytes_served_total", f"0+{10 * mib}x60", source="disk", **a),
                _series("hoard_bytes_served_total", f"0+{mib}x60", source="origin", job="twin"),
                _series("hoard_bytes_served_total", f"0+{99 * mib}x60", source="disk", job="twin"),
            ],
            "alert_rule_test": [
                _fires("20m", "HoardHitRatioCollapse"),
                _fires("50m", "HoardHitRatioCollapse", warn),
            ],
        },
        {  # 10 % of requests to "aws" fail; "gcs" only answers NoSuchKey.
            "input_series": [
                _series("hoard_origin_requests_total", "0+600x30", origin="aws", **a),
                _series(
                    "hoard_origin_errors_total",
                    "0+60x30",
                    origin="aws",
                    operation="GetObject",
                    error="OriginUnavailable",
                    **a,
                ),
                _series("hoard_origin_requests_total", "0+600x30", origin="gcs", **a),
                _series(
                    "hoard_origin_errors_total",
                    "0+300x30",
                    origin="gcs",
                    operation="HeadObject",
                    error="NoSuchKey",
                    **a,
                ),
            ],
            "alert_rule_test": [_fires("20m", "HoardOriginErrors", {**warn, "origin": "aws"})],
        },
        {
            "input_series": [
                _series("hoard_origin_breaker_open", "0x5 1x10", origin="aws", **a),
                _series("hoard_origin_breaker_open", "0x15", origin="aws", **b),
            ],
            "alert_rule_test": [
                _fires("10m", "HoardOriginBreakerOpen", {**crit, **a, "origin": "aws"})
            ],
        },
        {  # a: full, evicting, half from the origin. b: full, evicting, hot. Neither over.
            "input_series": [
                *(_series("hoard_cache_bytes", "99x120", tier="disk", **node) for node in (a, b)),
                *(
                    _series("hoard_cache_limit_bytes", "100x120", tier="disk", **node)
                    for node in (a, b)
                ),
                *(
                    _series("hoard_cache_evictions_total", "0+10x120", tier="disk", **node)
                    for node in (a, b)
                ),
                _series("hoard_bytes_served_total", "0+50x120", source="origin", **a),
                _series("hoard_bytes_served_total", "0+50x120", source="disk", **a),
                _series("hoard_bytes_served_total", "0+1x120", source="origin", **b),
                _series("hoard_bytes_served_total", "0+99x120", source="disk", **b),
            ],
            "alert_rule_test": [
                _fires("100m", "HoardDiskTierThrashing", {**warn, **a, "tier": "disk"}),
                _fires("100m", "HoardDiskTierOverLimit"),
            ],
        },
        {
            "input_series": [
                _series("hoard_cache_bytes", "110x30", tier="disk", **a),
                _series("hoard_cache_limit_bytes", "100x30", tier="disk", **a),
            ],
            "alert_rule_test": [
                _fires("20m", "HoardDiskTierOverLimit", {**warn, **a, "tier": "disk"})
            ],
        },
        {
            "input_series": [
                _series("hoard_cache_corrupt_blocks_total", "0x5 1x20", **a),
                _series("hoard_cache_corrupt_blocks_total", "3x25", **b),
            ],
            "alert_rule_test": [
                _fires("4m", "HoardCorruptBlocks"),
                _fires("8m", "HoardCorruptBlocks", {**warn, **a}),
                _fires("25m", "HoardCorruptBlocks"),
            ],
        },
    ]
    tested = {case["alertname"] for test in tests for case in test["alert_rule_test"]}
    assert tested == {alert for alert, _ in alert_rules()}
    unit = {"rule_files": [str(tmp_path / "alerts.yml")], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", **test} for test in tests]}  # fmt: skip
    (tmp_path / "alerts_test.yml").write_text(yaml.safe_dump(unit))
    promtool("test", "rules", str(tmp_path / "alerts_test.yml"))


# ---------------------------------------------------------------- live


class Prometheus:
    """A Prometheus process on a free loopback port with its own storage."""

    def __init__(self, workdir: Path, config: dict[str, Any]) -> None:
        assert PROMETHEUS is not None
        self.port = free_port()
        self.workdir = workdir
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / "prometheus.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={self.config_path}",
                 f"--storage.tsdb.path={workdir / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def wait_ready(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"prometheus exited:\n{self.log()}"
            try:
                if requests.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise AssertionError(f"prometheus not ready:\n{self.log()}")

    def api(self, path: str, **params: str) -> dict[str, Any]:
        answer = requests.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        body = answer.json()
        assert body["status"] == "success", (params, body)
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data)
        return data["result"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def values(result: list[dict[str, Any]]) -> list[float]:
    return [float(sample["value"][1]) for sample in result]


def wait_for(check, deadline: float, what: str) -> None:
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.skipif(
    PROMETHEUS is None,
    reason="prometheus binary not installed (Debian package 'prometheus'; "
    "scripts/test installs it when apt is available)",
)
@pytest.mark.timeout(90)
def test_dashboards_and_alerts_against_real_prometheus(tmp_path, moto_endpoint, origin_client):
    deadline = time.monotonic() + DEADLINE
    bucket = f"prom-{uuid.uuid4().hex[:10]}"
    origin_client.create_bucket(Bucket=bucket)
    for name in ("a", "b", "c"):
        origin_client.put_object(Bucket=bucket, Key=f"data/{name}", Body=bytes(1536 * 1024))
    hoard_config = {
        "origins": {"moto": {"type": "s3", "endpoint": moto_endpoint, "access_key": ORIGIN_KEY,
                             "secret_key": ORIGIN_SECRET, "addressing_style": "path"}},
        "default_origin": "moto",
        "allow_anonymous": True,
        "cache": {"block_size": "1MiB", "size": "256MiB", "memory": "16MiB"},
    }  # fmt: skip
    nodes = [HoardProcess(tmp_path / f"node{i}", hoard_config) for i in (1, 2)]
    prometheus = None
    try:
        for node in nodes:
            node.start()
        # The repository's prometheus.yml, pointed at the loopback nodes and sped up.
        config = yaml.safe_load(PROMETHEUS_YML.read_text())
        config["global"].update(scrape_interval="1s", evaluation_interval="1s",
                                scrape_timeout="1s")  # fmt: skip
        config["rule_files"] = [str(ALERTS_YML)]
        (job,) = config["scrape_configs"]
        assert job["job_name"] == VARIABLES["job"]
        job["static_configs"] = [{"targets": [f"127.0.0.1:{node.port}" for node in nodes]}]
        (tmp_path / "prometheus").mkdir()
        prometheus = Prometheus(tmp_path / "prometheus", config)
        prometheus.wait_ready(deadline)

        def scraped_since(moment: float) -> bool:
            """Every node's last scrape started after ``moment`` (Unix time)."""
            stamps = values(prometheus.query('timestamp(up{job="hoard"})'))
            return len(stamps) == len(nodes) and min(stamps) > moment

        # Phase 1 creates every series (cold fill from the origin, then warm
        # hits); phase 2 makes them all grow between scrapes, so rates are real.
        for node in nodes:
            client = node.client()
            client.list_objects_v2(Bucket=bucket, Prefix="data/")
            client.get_object(Bucket=bucket, Key="data/a")["Body"].read()
            client.get_object(Bucket=bucket, Key="data/a")["Body"].read()
        # (The last request is counted just after its body has gone out: allow a margin.)
        phase1 = time.time()
        wait_for(lambda: scraped_since(phase1 + 0.5), deadline, "a scrape after phase 1")
        for node in nodes:
            client = node.client()
            client.list_objects_v2(Bucket=bucket, Prefix="data/")
            client.head_object(Bucket=bucket, Key="data/b")
            for key in ("data/b", "data/c", "data/a", "data/b", "data/c"):
                client.get_object(Bucket=bucket, Key=key)["Body"].read()
            with pytest.raises(client.exceptions.NoSuchKey):
                client.get_object(Bucket=bucket, Key="data/missing")
        # Two scrapes after the workload: the second one starts > 1 s after it ended.
        done = time.time()
        wait_for(lambda: scraped_since(done + 1.5), deadline, "two scrapes after the workload")
        assert values(prometheus.query('up{job="hoard"}')) == [1.0] * len(nodes)

        # (1) Every expression parses and evaluates.
        results: dict[tuple[str, str], list[list[dict[str, Any]]]] = {}
        for uid, title, expr in dashboard_queries():
            results.setdefault((uid, title), []).append(prometheus.query(concrete(expr)))
        for _alert, expr in alert_rules():
            prometheus.query(expr)

        # (2) The core panels show data: each target a sample, some finite.
        for key in CORE_PANELS:
            assert key in results, f"no panel {key}"
            for result in results[key]:
                assert result, f"{key} returned nothing"
                assert any(math.isfinite(v) for v in values(result)), (key, result)
        (hit_ratio,) = values(results[("hoard-overview", "Hit ratio")][0])
        assert 0 < hit_ratio < 1  # phase 2 read cold and warm bytes
        assert values(results[("hoard-cluster", "Members up")][0]) == [len(nodes)]
        per_node = results[("hoard-cluster", "Requests per node")][0]
        assert {sample["metric"]["instance"] for sample in per_node} == {
            f"127.0.0.1:{node.port}" for node in nodes
        }
        by_operation = results[("hoard-overview", "Request rate by operation")][0]
        operations = {sample["metric"]["operation"] for sample in by_operation}
        assert {"GetObject", "ListObjectsV2", "HeadObject"} <= operations

        # The variables' label_values() queries, as Grafana sends them.
        for (uid, name), (label, selector) in variable_queries().items():
            found = prometheus.api(f"label/{label}/values", **{"match[]": concrete(selector)})
            assert found, (uid, name)
            if name == "mount":  # the test's buckets pass through to default_origin
                assert found == ["default"]
            if name == "node":
                assert sorted(found) == sorted(f"127.0.0.1:{node.port}" for node in nodes)

        # Prometheus loaded the alert rules, evaluated them all, and none fires.
        def rules_evaluated() -> bool:
            groups = prometheus.api("rules", type="alert")["groups"]
            rules = [rule for group in groups for rule in group["rules"]]
            return len(rules) == len(alert_rules()) and all(
                rule["health"] != "unknown" for rule in rules
            )

        wait_for(rules_evaluated, deadline, "the alert rules to be evaluated")
        for group in prometheus.api("rules", type="alert")["groups"]:
            for rule in group["rules"]:
                assert rule["health"] == "ok", rule
                assert rule["state"] != "firing", rule
    finally:
        if prometheus is not None:
            prometheus.stop()
        for node in nodes:
            node.stop()
    assert time.monotonic() < deadline + 15
