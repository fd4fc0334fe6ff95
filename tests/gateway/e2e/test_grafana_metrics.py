"""infra/grafana: every metric the Grafana dashboard queries exists in a live gateway's or backend's
/metrics, and the Prometheus and provisioning files point at what compose.yaml runs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.fleet.catalog import DEFAULT_MODEL_ID
from tests.gateway.fixtures_e2e import BackendProcess, InProcessGateway

pytestmark = pytest.mark.slow
INFRA = Path(__file__).resolve().parents[3] / "infra"
GRAFANA = INFRA / "grafana"
METRIC = re.compile(r"\b(edgerun_[a-zA-Z0-9_]+)\b")
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("", "_sum", "_count")}


def dashboard() -> dict[str, Any]:
    return json.loads((GRAFANA / "dashboards" / "edgerun.json").read_text())


def queried_metrics() -> dict[str, str]:
    """metric name -> the panel title that queries it."""
    found = {}
    for panel in dashboard()["panels"]:
        for target in panel["targets"]:
            names = METRIC.findall(target["expr"])
            assert names, f"{panel['title']}: {target['expr']} names no edgerun metric"
            found.update(dict.fromkeys(names, panel["title"]))
    return found


def exposed(text: str) -> set[str]:
    """Every series name a scrape of this text can yield: the samples present, and for each declared
    family the names it will have once it has children (a labelled family has no sample until used)."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(" ", 3)
            names.update(family + s for s in SUFFIXES.get(kind, ("",)))
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def test_every_queried_metric_is_in_a_live_metrics_page(
    gateway: InProcessGateway, backend_pair: list[BackendProcess]
) -> None:
    url = f"{gateway.url}/client/v4/accounts/acc-grafana/ai/run/{DEFAULT_MODEL_ID}"
    key = gateway.new_key("grafana", "acc-grafana")
    body = {"prompt": "Count to five.", "max_tokens": 4, "stream": True}
    assert httpx.post(url, json=body, headers={"authorization": f"Bearer {key}"}, timeout=60).status_code == 200
    assert httpx.post(url, json=body, headers={"authorization": "Bearer nope"}, timeout=10).status_code == 401

    gateway_names = exposed(httpx.get(f"{gateway.url}/metrics", timeout=10).text)
    backend_names = exposed(httpx.get(f"{backend_pair[0].url}/metrics", timeout=10).text)
    assert "edgerun_gateway_errors_total" in gateway_names and "edgerun_gateway_inter_token_seconds_bucket" in gateway_names
    queried = queried_metrics()
    assert len(queried) >= 15
    missing = {
        name: title
        for name, title in queried.items()
        if name not in (gateway_names if name.startswith("edgerun_gateway_") else backend_names)
    }
    assert not missing, f"the Grafana dashboard queries metrics no /metrics has: {missing}"

    # a counter only ever goes up: the dashboard must read its rate, never the raw value
    counters = counter_names(httpx.get(f"{gateway.url}/metrics", timeout=10).text)
    counters |= counter_names(httpx.get(f"{backend_pair[0].url}/metrics", timeout=10).text)
    for panel in dashboard()["panels"]:
        for target in panel["targets"]:
            for name in set(METRIC.findall(target["expr"])) & counters:
                assert re.search(rf"rate\({name}(\{{[^}}]*\}})?\[", target["expr"]), target["expr"]


def counter_names(text: str) -> set[str]:
    return {line.split(" ")[2] for line in text.splitlines() if line.startswith("# TYPE ") and line.endswith(" counter")}


def test_every_query_is_well_formed() -> None:
    for panel in dashboard()["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for opening, closing in ("()", "{}", "[]"):
                depth = 0
                for char in expr:
                    depth += (char == opening) - (char == closing)
                    assert depth >= 0, f"{panel['title']}: unbalanced {closing} in {expr}"
                assert depth == 0, f"{panel['title']}: unbalanced {opening} in {expr}"
            # histogram buckets are read as rates over Grafana's interval, never raw
            for name in METRIC.findall(expr):
                if name.endswith("_bucket"):
                    assert re.search(rf"rate\({name}(\{{[^}}]*\}})?\[\$__rate_interval\]\)", expr), expr


def test_the_dashboard_reads_the_provisioned_datasource() -> None:
    [source] = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text())["datasources"]
    uids = {t["datasource"]["uid"] for p in dashboard()["panels"] for t in p["targets"]}
    assert uids == {source["uid"]} and source["url"] == "http://prometheus:9090"
    [provider] = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "edgerun.yaml").read_text())["providers"]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"


def test_prometheus_scrapes_what_compose_runs() -> None:
    compose = yaml.safe_load((INFRA / "compose.yaml").read_text())["services"]
    config = yaml.safe_load((GRAFANA / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    targets = {job: {t for c in j["static_configs"] for t in c["targets"]} for job, j in jobs.items()}
    gateways = {n: s["command"] for n, s in compose.items() if s.get("command", [])[:2] == ["edgerun", "serve"]}
    backends = {n for n, s in compose.items() if s.get("command", [])[:2] == ["edgerun", "backend"]}
    # a gateway's /metrics is on its admin listener (the public port answers 404 there)
    admin_ports = {n: c[c.index("--admin-port") + 1] for n, c in gateways.items()}
    assert targets["edgerun-gateway"] == {f"{n}:{port}" for n, port in admin_ports.items()}
    assert targets["edgerun-backend"] == {f"{n}:8100" for n in backends}
    # backends answer /metrics only with the backend key, which the prometheus service writes to this file
    assert jobs["edgerun-backend"]["authorization"]["credentials_file"] == "/tmp/backend-key"
    prometheus, grafana = compose["prometheus"], compose["grafana"]
    assert "/tmp/backend-key" in prometheus["command"][0]
    assert "./grafana/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prometheus["volumes"]
    assert "./grafana/provisioning:/etc/grafana/provisioning:ro" in grafana["volumes"]
    assert all(p.startswith("127.0.0.1:") for p in prometheus["ports"] + grafana["ports"])  # loopback only
