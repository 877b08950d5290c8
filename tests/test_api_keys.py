"""API keys on every protocol (docs/SECURITY.md), with each protocol's real client."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
from huggingface_hub import InferenceClient
from websockets.exceptions import ConnectionClosed

from clients import connect, greedy, payload, web
from gateway.edge.api_keys import KeyRing, parse_keys, presented_key
from gateway.edge.auth import is_open
from gateway.http.admin import ADMIN_PATHS
from serving import LoopThread, RunningServer, gateway_settings, shared_loader, start_server

if TYPE_CHECKING:
    from gateway.engine.vllm_engine import VllmEngine

KEY, OTHER, LATER = "sk-first-0123456789", "sk-second-9876543210", "sk-later-5555555555"
QUESTION: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "keys.txt"
    path.write_text(f"# the team's keys\n{OTHER}:batch-jobs\n")
    return path


@pytest.fixture(scope="module")
def guarded(
    loop_thread: LoopThread, engine: VllmEngine, keys_file: Path
) -> Iterator[RunningServer]:
    settings = gateway_settings(API_KEYS=KEY, API_KEYS_FILE=str(keys_file))
    server = start_server(loop_thread, settings, shared_loader(engine))
    try:
        yield server
    finally:
        server.stop()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_keys_are_parsed_and_named_without_showing_them() -> None:
    keys = parse_keys("a1, b2:ci", "# comment\n\nc3:team\n")
    assert keys["b2"].name == "ci" and keys["c3"].name == "team"
    assert keys["a1"].name.startswith("key-") and "a1" not in keys["a1"].name
    assert keys["a1"].label == keys["a1"].name and keys["b2"].label != keys["c3"].label
    ring = KeyRing("a1,b2:ci")
    found = ring.entry_of("b2")
    assert found is not None and found.name == "ci"
    assert ring.entry_of("b") is None and ring.entry_of("") is None
    assert not KeyRing("").enabled
    websocket = {"type": "websocket", "headers": [], "subprotocols": ["bearer.k1"]}
    assert presented_key(websocket) == "k1"
    assert (
        presented_key({"type": "websocket", "headers": [], "query_string": b"api_key=k2"}) == "k2"
    )
    http = {"type": "http", "headers": [(b"x-api-key", b"k3")], "query_string": b"api_key=no"}
    assert presented_key(http) == "k3"
    assert is_open("/ui/playground.js", frozenset({"/ui/*"})) and not is_open(
        "/uix", frozenset({"/ui/*"})
    )
    # `+` is one segment: the management routes are open to their own admin check, SageMaker's
    # multi-model invocation under the same prefix is not
    assert is_open("/models/mini", ADMIN_PATHS) and is_open("/models/m/adapters/a", ADMIN_PATHS)
    assert not is_open("/models/mini/invoke", ADMIN_PATHS)


def test_every_http_protocol_refuses_a_missing_or_wrong_key_in_its_own_shape(
    guarded: RunningServer,
) -> None:
    def post(path: str, body: dict[str, Any], key: str | None = None) -> httpx.Response:
        headers = bearer(key) if key else {}
        return web.post(guarded.http + path, json=body, headers=headers)

    chat = post("/v1/chat/completions", {"messages": QUESTION}, "sk-wrong")
    assert chat.status_code == 401 and chat.json()["error"]["code"] == "invalid_api_key"
    assert chat.headers["www-authenticate"] == "Bearer"
    lmi = post("/invocations", {"inputs": "Hi"})
    assert lmi.status_code == 401 and lmi.json()["code"] == 401 and "API key" in lmi.json()["error"]
    for path in ("/predictions/SmolLM2-135M-Instruct", "/models/SmolLM2-135M-Instruct/invoke"):
        assert post(path, {"inputs": "Hi"}).status_code == 401, path
    tgi = post("/generate", {"inputs": "Hi"})
    assert tgi.status_code == 401 and tgi.json()["error_type"] == "authentication"
    rest = post("/api/generate-one", {"prompt": "Hi"})
    assert rest.status_code == 401 and rest.json()["type"] == "unauthorized"
    control = post("/v1/generate", {"prompt": "Hi"})
    assert control.status_code == 401 and control.json()["error"] == "unauthorized"
    for open_path in ("/health", "/ping", "/ui"):
        assert web.get(guarded.http + open_path).status_code == 200, open_path
    assert web.get(guarded.http + "/metrics").status_code == 401  # METRICS_PUBLIC opens it

    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=guarded.http + "/v1", api_key="sk-wrong", max_retries=0
        ).models.list()


def test_each_client_sends_its_key_the_way_it_does(guarded: RunningServer) -> None:
    api = openai.OpenAI(base_url=guarded.http + "/v1", api_key=KEY, max_retries=0)
    answer = api.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=QUESTION, temperature=0, max_tokens=8
    )
    assert answer.choices[0].message.content
    hub = InferenceClient(base_url=guarded.http, token=OTHER)  # a key from the keys file
    assert hub.chat_completion(QUESTION, max_tokens=8, temperature=0).choices[0].message.content
    lmi = web.post(
        guarded.http + "/invocations",
        json={"inputs": "Hi", "parameters": {"max_new_tokens": 4}},
        headers={"X-Api-Key": KEY},
    )
    assert lmi.status_code == 200 and lmi.json()["generated_text"]


def test_websockets_take_a_subprotocol_or_query_key_and_close_1008_without(
    guarded: RunningServer,
) -> None:
    message = payload(("auth-1", "Hi"), generation_config=greedy(3))
    with connect(guarded.ws + "/ws", subprotocols=[f"bearer.{KEY}"]) as ws:
        assert ws.subprotocol == f"bearer.{KEY}"
        ws.send(message)
        first = json.loads(ws.recv())
        assert first == [{"type": "ACCEPTED", "request_id": "auth-1"}]
    with connect(f"{guarded.ws}/generate?api_key={OTHER}") as ws:
        ws.send(json.dumps({"type": "config", "prompt": "Hi", "parameters": {"max_tokens": 2}}))
        assert json.loads(ws.recv())["type"] in ("init", "status")
    for path in ("/ws", "/generate", "/ws/events"):
        with connect(guarded.ws + path) as ws, pytest.raises(ConnectionClosed) as closed:
            ws.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008, path


def test_sighup_rereads_the_keys_file(guarded: RunningServer, keys_file: Path) -> None:
    def status(key: str) -> int:
        return web.get(guarded.http + "/v1/models", headers=bearer(key)).status_code

    assert status(OTHER) == 200 and status(LATER) == 401
    keys_file.write_text(f"{LATER}:rotated\n")
    os.kill(os.getpid(), signal.SIGHUP)  # the handler runs in this, the main, thread
    assert status(LATER) == 200 and status(OTHER) == 401
    assert status(KEY) == 200  # API_KEYS stays


def test_a_history_belongs_to_the_key_that_made_it(
    make_server: Callable[..., RunningServer],
) -> None:
    guarded = make_server(API_KEYS=f"{KEY},{OTHER}")

    def generate(key: str, prompt: str) -> Any:
        body = {
            "prompts": [{"request_id": "shared-id", "prompt": prompt}],
            "only_new_tokens": False,
            "generation_config": greedy(4, ignore_eos=True),
        }
        answer = web.post(guarded.http + "/api/generate-batch", json=body, headers=bearer(key))
        assert answer.status_code == 200, answer.text
        return answer.json()[0]

    secret = "My password is swordfish."
    mine = generate(KEY, secret)
    assert mine["prompt"] == secret
    # The same id from another key is a new history: nothing of the first is read or continued.
    theirs = generate(OTHER, "Hello")
    assert theirs["prompt"] == "Hello" and secret not in theirs["prompt"] + theirs["response"]
    again = generate(KEY, "ignored: the history continues")
    assert again["prompt"] == secret + mine["response"]


def test_boto3_sends_the_key_as_a_header_it_adds(guarded: RunningServer) -> None:
    import boto3  # type: ignore[import-untyped]
    from botocore.exceptions import ClientError  # type: ignore[import-untyped]

    def runtime(key: str | None) -> Any:
        client = boto3.client(
            "sagemaker-runtime",
            endpoint_url=guarded.http,
            region_name="us-east-1",
            aws_access_key_id="x",
            aws_secret_access_key="x",
        )
        if key is not None:  # SigV4 owns Authorization: the key goes in X-Api-Key

            def add_key(request: Any, **_: Any) -> None:
                request.headers["X-Api-Key"] = key

            client.meta.events.register("before-send.sagemaker-runtime", add_key)
        return client

    body = json.dumps({"inputs": "Hi", "parameters": {"max_new_tokens": 4}})
    answer = runtime(KEY).invoke_endpoint(EndpointName="local", Body=body)
    assert json.loads(answer["Body"].read())["generated_text"]
    with pytest.raises(ClientError) as refused:
        runtime(None).invoke_endpoint(EndpointName="local", Body=body)
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 401
