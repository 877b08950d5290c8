"""deploy/: every Dockerfile passes hadolint, every Kustomize overlay renders into manifests
that are valid for Kubernetes (offline, against its schema), and both follow the drain."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from deploy_files import DOCKERFILE, ROOT, entrypoint, instructions

from gateway.config.settings import Settings

DOCKERFILES = sorted(p for p in (ROOT / "deploy").rglob("Dockerfile*") if p.suffix == "")
OVERLAYS = sorted(p for p in (ROOT / "deploy/k8s/overlays").iterdir() if p.is_dir())
SCHEMAS = ROOT / "deploy/k8s/schemas"
CUSTOM = {("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.monitoring.coreos.com-v1"}
BIN = Path(sys.executable).parent
DRAIN_SECONDS = Settings().drain_seconds


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_dockerfile_passes_hadolint(dockerfile: Path) -> None:
    lint = subprocess.run(
        [BIN / "hadolint", dockerfile], capture_output=True, text=True, check=False
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_the_image_stops_with_a_drain_and_checks_health() -> None:
    dockerfile = DOCKERFILE
    assert instructions(dockerfile, "STOPSIGNAL") == ["SIGTERM"]
    assert entrypoint() == ["llm-gateway", "container"]
    (healthcheck,) = instructions(dockerfile, "HEALTHCHECK")
    assert healthcheck.endswith('CMD ["llm-gateway", "container", "health"]')
    assert "USER 10001:10001" in dockerfile.read_text()


def rendered(overlay: Path) -> list[dict[str, Any]]:
    kustomize = subprocess.run(
        [BIN / "kubectl", "kustomize", overlay], capture_output=True, text=True, check=True
    )
    return [doc for doc in yaml.safe_load_all(kustomize.stdout) if doc]


def validate(resource: dict[str, Any]) -> None:
    custom = CUSTOM.get((resource["apiVersion"], resource["kind"]))
    if custom is None:
        kubernetes_validate.validate(resource, kubernetes_validate.latest_version(), strict=True)
        return
    schema = json.loads((SCHEMAS / f"{custom}.json").read_text())
    jsonschema.validate(resource, schema)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_every_overlay_renders_into_valid_manifests(overlay: Path) -> None:
    resources = rendered(overlay)
    kinds = sorted(r["kind"] for r in resources)
    assert kinds == ["Deployment", "PodDisruptionBudget", "Service", "ServiceMonitor"]
    for resource in resources:
        validate(resource)


def test_an_invalid_manifest_is_refused() -> None:
    (deployment,) = (r for r in rendered(OVERLAYS[0]) if r["kind"] == "Deployment")
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)
    (monitor,) = (r for r in rendered(OVERLAYS[0]) if r["kind"] == "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["interval"] = 15
    with pytest.raises(jsonschema.ValidationError):
        validate(monitor)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_probes_and_shutdown_follow_the_drain(overlay: Path) -> None:
    (deployment,) = (r for r in rendered(overlay) if r["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    drain = float(env.get("DRAIN_SECONDS") or DRAIN_SECONDS)
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    # SIGKILL comes after the grace period: it must leave the drain its whole time.
    assert pod["terminationGracePeriodSeconds"] >= float(pre_stop[1]) + drain + 15
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == "/health"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # torch.compile
    # /health answers 503 while the engine loads or is rebuilt: liveness must not use it.
    assert container["livenessProbe"]["httpGet"]["path"] == "/metrics"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8080} and env["PORT"] == "8080"
    if overlay.name == "gpu":
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert container["image"] == "llm-gateway:cuda"
    else:
        assert container["image"] == "llm-gateway:cpu"
