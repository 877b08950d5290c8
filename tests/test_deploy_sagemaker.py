"""The SageMaker entry point, started natively exactly as the image starts it.

`llm-gateway container serve` is what SageMaker's `docker run <image> serve` runs (the
Dockerfile's ENTRYPOINT plus SageMaker's argument), with the environment SageMaker gives, and a
temporary directory in place of /opt/ml/model (SAGEMAKER_MODEL_DIR) holding LMI's
serving.properties. boto3's `sagemaker-runtime` client talks to it as to an endpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3  # type: ignore[import-untyped]
import httpx
import psutil
import pytest
from botocore.config import Config  # type: ignore[import-untyped]
from deploy_files import entrypoint

from clients import CHAT, wait_for, web
from serving import free_port

pytestmark = [pytest.mark.engine, pytest.mark.own_engine]  # the container's own engine
# The Dockerfile's ENTRYPOINT, from this environment, with SageMaker's argument.
IMAGE_COMMAND = entrypoint()
COMMAND = [str(Path(sys.executable).with_name(IMAGE_COMMAND[0])), *IMAGE_COMMAND[1:], "serve"]


@dataclass
class Endpoint:
    process: subprocess.Popen[bytes]
    http: str
    port: int
    env: dict[str, str]
    stdout: Path
    stderr: Path


def runtime(endpoint: Endpoint) -> Any:
    """boto3's client for an endpoint at this address: no retries, no timeouts."""
    return boto3.client(
        "sagemaker-runtime",
        endpoint_url=endpoint.http,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(retries={"max_attempts": 0}, connect_timeout=None, read_timeout=None),
    )


def _answers_ping(endpoint: Endpoint) -> bool:
    if endpoint.process.poll() is not None:
        pytest.fail(f"the endpoint exited: {endpoint.stdout.read_text()[-4000:]}")
    try:
        return web.get(endpoint.http + "/ping").status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    from gateway.engine.default_model import prepare_default_model

    model_dir = tmp_path_factory.mktemp("opt-ml-model")
    (model_dir / "serving.properties").write_text(
        "engine=Python\n"
        "option.rolling_batch=vllm\n"
        f"option.model_id={prepare_default_model()}\n"
        "option.max_model_len=1024\n"
        "option.enforce_eager=true\n"
        f"option.kv_cache_memory_bytes={512 << 20}\n"
    )
    port = free_port()
    env = {
        **os.environ,
        "SAGEMAKER_MODEL_DIR": str(model_dir),
        "SAGEMAKER_BIND_TO_PORT": str(port),
        "SAGEMAKER_MODEL_SERVER_TIMEOUT": "300",
        "SAGEMAKER_MODEL_SERVER_WORKERS": "1",
    }
    logs = tmp_path_factory.mktemp("logs")
    stdout, stderr = logs / "stdout", logs / "stderr"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        process = subprocess.Popen(COMMAND, env=env, cwd=logs, stdout=out, stderr=err)
    running = Endpoint(process, f"http://127.0.0.1:{port}", port, env, stdout, stderr)
    try:
        wait_for(lambda: _answers_ping(running))
        yield running
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_ping_and_invocations_answer_as_the_contract_says(endpoint: Endpoint) -> None:
    ping = web.get(endpoint.http + "/ping")
    assert ping.status_code == 200 and ping.json() == {"status": "ready"}
    answer = web.post(
        endpoint.http + "/invocations",
        json={"inputs": CHAT.format("Say hi."), "parameters": {"max_new_tokens": 5}},
    )
    assert answer.status_code == 200 and answer.json()["generated_text"]


def test_boto3_invokes_the_endpoint(endpoint: Endpoint) -> None:
    client = runtime(endpoint)
    body = json.dumps(
        {"inputs": CHAT.format("Name a colour."), "parameters": {"max_new_tokens": 5}}
    )
    response = client.invoke_endpoint(
        EndpointName="gateway", Body=body, ContentType="application/json"
    )
    assert json.loads(response["Body"].read())["generated_text"]
    streamed = client.invoke_endpoint_with_response_stream(
        EndpointName="gateway",
        Body=json.dumps({"inputs": "Hello", "parameters": {"max_new_tokens": 3}, "stream": True}),
    )
    lines = b"".join(event["PayloadPart"]["Bytes"] for event in streamed["Body"]).splitlines()
    assert len(lines) == 3 and "generated_text" in json.loads(lines[-1])


def test_serving_properties_configured_the_engine(endpoint: Endpoint) -> None:
    info = web.get(endpoint.http + "/info").json()
    assert info["max_total_tokens"] == 1024 and info["max_input_tokens"] == 1023


def test_the_image_healthcheck_command_sees_it_healthy(endpoint: Endpoint) -> None:
    health = subprocess.run([*COMMAND[:2], "health"], env=endpoint.env, check=False)
    assert health.returncode == 0


def test_it_listens_on_every_address_logs_to_stdout_and_drains_on_sigterm(
    endpoint: Endpoint,
) -> None:
    # SageMaker's contract: 0.0.0.0, on the port it gave (the socket itself, not a log line).
    connections = psutil.Process(endpoint.process.pid).net_connections("tcp")
    listening = {tuple(c.laddr) for c in connections if c.status == psutil.CONN_LISTEN}
    assert ("0.0.0.0", endpoint.port) in listening, listening
    endpoint.process.send_signal(signal.SIGTERM)
    assert endpoint.process.wait() == 0
    assert "draining" in endpoint.stdout.read_text()  # the gateway's own log line
    assert endpoint.stderr.read_text() == ""
