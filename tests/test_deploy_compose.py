"""deploy/compose: the Compose file, Prometheus' scrape config and the Grafana dashboard parse,
fit together, and use only metrics the gateway's /metrics serves."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from deploy_files import DOCKERFILE, ROOT, instructions

from clients import web
from gateway.config.settings import Settings
from serving import RunningServer

COMPOSE = ROOT / "deploy/compose"
DASHBOARD = COMPOSE / "grafana/dashboards/llm-gateway.json"
METRIC = re.compile(r"\bgateway_[a-z0-9_]+\b")
HISTOGRAM_SAMPLES = ("_bucket", "_sum", "_count")


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def served_metric_names(exposition: str) -> set[str]:
    """Every sample name /metrics serves or would serve once its labels have values."""
    names: set[str] = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            names.add(name)
            if kind == "histogram":
                names.update(name + suffix for suffix in HISTOGRAM_SAMPLES)
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_compose_builds_the_image_and_gives_the_drain_its_time() -> None:
    compose = load(COMPOSE / "compose.yaml")
    gateway = compose["services"]["gateway"]
    build = gateway["build"]
    assert (COMPOSE / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    targets = {line.split()[-1] for line in instructions(DOCKERFILE, "FROM")}
    assert build["target"].removeprefix("${IMAGE_TARGET:-").removesuffix("}") in targets
    assert gateway["ports"] == ["8080:8080"]
    grace = int(gateway["stop_grace_period"].removesuffix("s"))
    assert grace > float(gateway["environment"]["DRAIN_SECONDS"]) >= Settings().drain_seconds
    for service in ("prometheus", "grafana"):
        for volume in compose["services"][service]["volumes"]:
            assert (COMPOSE / volume.split(":")[0]).exists(), volume


def test_prometheus_scrapes_the_gateway() -> None:
    (job,) = load(COMPOSE / "prometheus.yml")["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"] == [{"targets": ["gateway:8080"]}]


def test_grafana_reads_the_dashboard_from_prometheus() -> None:
    (source,) = load(COMPOSE / "grafana/provisioning/datasources/prometheus.yaml")["datasources"]
    assert source["url"] == "http://prometheus:9090"
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == source["uid"]
    titles = " ".join(panel["title"] for panel in dashboard["panels"]).lower()
    for shown in ("first token", "inter-token", "tokens", "queue", "streams", "continuation"):
        assert shown in titles
    assert "errors per protocol" in titles


def test_every_metric_the_dashboard_uses_is_served(server: RunningServer) -> None:
    exposition = web.get(server.http + "/metrics").text
    served = served_metric_names(exposition)
    used = {name for expr in dashboard_expressions() for name in METRIC.findall(expr)}
    assert len(used) >= 10
    assert used <= served, used - served
