"""The container's entry point: `llm-gateway container [serve | health | llm-gateway ...]`.

deploy/docker/Dockerfile's ENTRYPOINT is `llm-gateway container`, so the image runs as

    <image>                    serves on 0.0.0.0:8080 (HOST and PORT change that)
    <image> serve              SageMaker's call: the SageMaker contract, below
    <image> llm-gateway ARGS   any llm-gateway command (prepare-model, bench, ...)
    <image> health             exits 0 while GET /health answers 200 (the HEALTHCHECK)

Under SageMaker (the `serve` argument, or any SM_* variable) the gateway listens on
0.0.0.0:8080, or SAGEMAKER_BIND_TO_PORT when SageMaker sets it, whatever HOST and PORT say,
and logs to stdout only. In both modes the model directory is /opt/ml/model, or
SAGEMAKER_MODEL_DIR: a Hugging Face model there is served, and LMI's serving.properties there
is read (gateway/config/aliases.py), unless MODEL, HF_MODEL_ID and the like name another.
"""

from __future__ import annotations

import logging
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from gateway.config.aliases import MODEL_DIR, given_host
from gateway.config.loading import load_settings
from gateway.config.settings import ConfigError
from gateway.server import run_server

SAGEMAKER_MODEL_DIR = "/opt/ml/model"
SAGEMAKER_PORT = "8080"
USAGE = "usage: llm-gateway container [serve | health | llm-gateway ARGS...]"


def is_sagemaker(argv: list[str], environ: Mapping[str, str]) -> bool:
    return argv[:1] == ["serve"] or any(name.startswith("SM_") for name in environ)


def container_env(environ: Mapping[str, str], sagemaker: bool) -> dict[str, str]:
    """The environment the gateway is configured from inside the container."""
    env = dict(environ)
    if not env.get(MODEL_DIR) and Path(SAGEMAKER_MODEL_DIR).is_dir():
        env[MODEL_DIR] = SAGEMAKER_MODEL_DIR
    if sagemaker:  # the contract, not a default: SageMaker probes exactly this address
        env["HOST"] = "0.0.0.0"
        env["PORT"] = env.get("SAGEMAKER_BIND_TO_PORT") or SAGEMAKER_PORT
        return env
    if not given_host(env):
        env["HOST"] = "0.0.0.0"
    env["PORT"] = env.get("PORT") or SAGEMAKER_PORT
    return env


def main(argv: list[str], environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    if argv not in ([], ["serve"], ["health"]):
        print(USAGE, file=sys.stderr)
        return 2
    sagemaker = is_sagemaker(argv, environ)
    env = container_env(environ, sagemaker)
    if argv == ["health"]:  # the port `serve` took, if SageMaker gave one
        return _health(env.get("SAGEMAKER_BIND_TO_PORT") or env["PORT"])
    if sagemaker:
        # SageMaker reads the container's stdout; the engine's processes inherit it too.
        os.dup2(sys.stdout.fileno(), sys.stderr.fileno())
    logging.basicConfig(
        stream=sys.stdout, level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = load_settings(env)
    except ConfigError as e:
        print(f"llm-gateway: invalid configuration: {e}", file=sys.stderr)
        return 2
    logging.getLogger().setLevel(settings.log_level.upper())
    try:
        return run_server(settings, settings.host, settings.port)
    except ConfigError as e:
        print(f"llm-gateway: invalid configuration: {e}", file=sys.stderr)
        return 2


def _health(port: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
            return 0 if answer.status == 200 else 1
    except (urllib.error.URLError, OSError):
        return 1
