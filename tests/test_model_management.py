"""DJL Serving's model management API over the model registry, on the real engines: an
embedding model registered at run time serves `/v1/embeddings` by its name until it is
unregistered, then is refused; every refusal is DJL's error shape with its status, a load that
does not fit the memory among them (refused before any engine starts)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from clients import wait_for, web
from gateway.engine.pooling_engine import PoolingEngine
from serving import RunningServer, gateway_settings

ADMIN = "admin-key"
NAME = "all-MiniLM-L6-v2"
CHAT = "SmolLM2-135M-Instruct"


@pytest.fixture
def managed(make_embedding_server: Callable[..., RunningServer]) -> RunningServer:
    """A budget of 0.1 GiB for models loaded at run time: any load is refused for memory."""
    return make_embedding_server(ADMIN_API_KEYS=ADMIN, MODEL_LOAD_MEMORY_GIB="0.1")


def _call(
    server: RunningServer, method: str, path: str, key: str | None = ADMIN, **query: Any
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return web.request(method, server.http + path, params=query, headers=headers)


def _refused(answer: httpx.Response, status: int, words: str) -> None:
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert body["code"] == status and body["type"] and words in body["message"], body


def test_the_list_and_description_name_every_model_and_its_task(managed: RunningServer) -> None:
    listed = _call(managed, "GET", "/models").json()["models"]
    assert [(m["modelName"], m["task"], m["status"]) for m in listed] == [
        (CHAT, "generate", "READY"),
        (NAME, "embed", "READY"),
    ]
    assert listed[1]["modelUrl"] == "default"
    [workflow] = _call(managed, "GET", f"/models/{NAME}").json()
    assert workflow["workflowName"] == NAME
    [described] = workflow["models"]
    assert described["status"] == "Healthy" and described["loadedAtStartup"] is True
    page = _call(managed, "GET", "/models", limit="1").json()
    assert [m["modelName"] for m in page["models"]] == [CHAT] and page["nextPageToken"] == "1"


@pytest.mark.parametrize(
    ("method", "path", "query", "status", "words"),
    [
        ("POST", "/models", {}, 400, "url"),
        ("POST", "/models", {"url": "/nowhere"}, 400, "not a model directory"),
        ("POST", "/models", {"url": "default", "task": "classify"}, 400, "task"),
        ("POST", "/models", {"url": "default", "task": "generate"}, 400, "model directory"),
        ("POST", "/models", {"url": "default", "colour": "red"}, 400, "colour"),
        ("POST", "/models", {"url": "default", "model_name": "a/b"}, 400, "model_name"),
        ("POST", "/models", {"url": "default", "model_name": "m" * 257}, 400, "model_name"),
        ("POST", "/models", {"url": "default", "model_name": "a\nb"}, 400, "model_name"),
        ("POST", "/models", {"url": "default", "model_name": NAME}, 409, "already registered"),
        ("POST", "/models", {"url": "default", "model_name": CHAT}, 409, "already registered"),
        ("POST", "/models", {"url": "default", "model_name": "mini"}, 507, "MODEL_LOAD_MEMORY"),
        ("DELETE", f"/models/{CHAT}", {}, 400, "chat model"),
        ("DELETE", "/models/nothing", {}, 404, "nothing"),
        ("GET", "/models/nothing", {}, 404, "nothing"),
    ],
)
def test_each_refusal_is_djls_error_naming_the_cause(
    managed: RunningServer, method: str, path: str, query: dict[str, str], status: int, words: str
) -> None:
    _refused(_call(managed, method, path, **query), status, words)


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"model_name": NAME, "url": "default"}, 409, "already registered"),
        ({"model_name": "mini", "url": "default"}, 507, "MODEL_LOAD_MEMORY"),
        ({"model_name": "mini"}, 400, "url"),
        ({"model_name": "mini", "url": 7}, 400, "$.url"),
        ({"model_name": "mini", "url": "/nowhere"}, 400, "not a model directory"),
    ],
)
def test_sagemakers_multi_model_load_is_the_same_call_with_a_json_body(
    managed: RunningServer, body: dict[str, Any], status: int, words: str
) -> None:
    """SageMaker's multi-model container contract: POST /models {"model_name", "url"}; 409
    for a name loaded, 507 for a model the memory cannot take (SageMaker then unloads others)."""
    answer = web.post(
        managed.http + "/models", json=body, headers={"Authorization": f"Bearer {ADMIN}"}
    )
    _refused(answer, status, words)


def test_only_an_admin_key_manages_models(managed: RunningServer) -> None:
    _refused(_call(managed, "GET", "/models", key=None), 401, "admin key")
    _refused(_call(managed, "POST", "/models", key="not-admin", url="default"), 403, "may not")
    assert [m["modelName"] for m in _call(managed, "GET", "/models").json()["models"]] == [
        CHAT,
        NAME,
    ]


def test_load_models_reads_djls_list() -> None:
    from gateway.config.settings import ConfigError, models_to_load

    settings = gateway_settings(LOAD_MODELS="a=default, /m/e5 ,b::PyTorch:cpu=/m/bge,")
    assert models_to_load(settings) == [("a", "default"), ("e5", "/m/e5"), ("b", "/m/bge")]
    with pytest.raises(ConfigError, match="names no model url"):
        models_to_load(gateway_settings(LOAD_MODELS="a="))


@pytest.mark.own_engine
def test_models_from_start_up_and_run_time_serve_until_unregistered(
    make_embedding_server: Callable[..., RunningServer],
) -> None:
    """LOAD_MODELS' model loads beside EMBEDDING_MODEL's; unregistered, it is refused; one
    registered at run time then serves in its place."""
    server = make_embedding_server(ADMIN_API_KEYS=ADMIN, LOAD_MODELS="mini-two=default")
    wait_for(lambda: _status(server, "mini-two") != "PENDING")
    assert _status(server, "mini-two") == "READY"
    [workflow] = _call(server, "GET", "/models/mini-two").json()
    assert workflow["models"][0]["loadedAtStartup"] is True
    oai = openai.OpenAI(api_key="k", base_url=server.http + "/v1", max_retries=0)
    text = "The cat sat on the mat."
    one = np.array(oai.embeddings.create(model=NAME, input=text).data[0].embedding)
    two = np.array(oai.embeddings.create(model="mini-two", input=text).data[0].embedding)
    assert float(one @ two) >= 0.999  # the same weights, another engine
    assert "mini-two" in [m.id for m in oai.models.list()]
    gone = _call(server, "DELETE", "/models/mini-two")
    assert gone.json() == {"status": 'Model or workflow "mini-two" unregistered'}
    with pytest.raises(openai.NotFoundError):
        oai.embeddings.create(model="mini-two", input=text)

    registered = _call(server, "POST", "/models", url="default", model_name="mini-three")
    assert registered.json() == {"status": 'Model "mini-three" registered.'}
    assert _status(server, "mini-three") == "READY"
    three = oai.embeddings.create(model="mini-three", input=text).data[0].embedding
    assert float(one @ np.array(three)) >= 0.999
    assert _call(server, "DELETE", "/models/mini-three").status_code == 200
    with pytest.raises(openai.NotFoundError):
        oai.embeddings.create(model="mini-three", input=text)
    assert oai.embeddings.create(model=NAME, input=text).data  # the start-up model serves

    # SageMaker's multi-model endpoint: load by a JSON body, invoke by the model's path, unload
    admin = {"Authorization": f"Bearer {ADMIN}"}
    loaded = web.post(
        server.http + "/models", json={"model_name": "mme", "url": "default"}, headers=admin
    )
    assert loaded.json() == {"status": 'Model "mme" registered.'}
    invoked = web.post(server.http + "/models/mme/invoke", json={"inputs": text}, headers=admin)
    assert float(one @ np.array(invoked.json()[0])) >= 0.999
    assert _call(server, "DELETE", "/models/mme").status_code == 200


def _status(server: RunningServer, name: str) -> str | None:
    listed = _call(server, "GET", "/models").json()["models"]
    return next((m["status"] for m in listed if m["modelName"] == name), None)


def test_the_embedding_engines_processes_are_niced(embedding_engine: PoolingEngine) -> None:
    """EMBEDDING_NICENESS (10): the kernel gives the chat engine the cores first."""
    import os

    from gateway.engine.vllm_seam import core_processes

    processes = core_processes(embedding_engine.llm)
    assert processes
    for process in processes:
        assert process.pid is not None
        assert os.getpriority(os.PRIO_PROCESS, process.pid) == 10


def test_boto3s_target_model_and_lmis_path_route_to_the_embedding_model(
    embedding_server: RunningServer,
) -> None:
    """SageMaker's multi-model TargetModel and LMI's `/predictions/{model}` naming the embedding
    model: TEI's SageMaker answer, the vectors `/v1/embeddings` gives; any other name: the
    chat model generates, as before."""
    import json

    from clients import sagemaker_runtime

    runtime = sagemaker_runtime(embedding_server.http)
    text = "The cat sat on the mat."
    answer = runtime.invoke_endpoint(
        EndpointName="any",
        TargetModel=NAME,
        ContentType="application/json",
        Body=json.dumps({"inputs": [text]}),
    )
    [vector] = json.loads(answer["Body"].read())
    oai = openai.OpenAI(api_key="k", base_url=embedding_server.http + "/v1", max_retries=0)
    expected = oai.embeddings.create(model=NAME, input=text).data[0].embedding
    assert float(np.array(vector) @ np.array(expected)) >= 0.999
    predicted = web.post(embedding_server.http + f"/predictions/{NAME}", json={"inputs": text})
    assert float(np.array(predicted.json()[0]) @ np.array(expected)) >= 0.999
    invoked = web.post(embedding_server.http + f"/models/{NAME}/invoke", json={"inputs": text})
    assert float(np.array(invoked.json()[0]) @ np.array(expected)) >= 0.999
    generated = runtime.invoke_endpoint(
        EndpointName="any",
        TargetModel="model.tar.gz",
        ContentType="application/json",
        Body=json.dumps({"inputs": "Hi", "parameters": {"max_new_tokens": 2}}),
    )
    assert "generated_text" in json.loads(generated["Body"].read())


def test_the_control_protocols_config_model_naming_the_embedding_model_is_refused(
    embedding_server: RunningServer,
) -> None:
    """A generation's `config.model` naming the embedding model: refused at `$.model`, saying
    what that model does; on the REST form too; the connection stays."""
    import json

    from control_client import config, receive

    from clients import connect

    with connect(embedding_server.ws + "/generate") as ws:
        ws.send(json.dumps({"type": "config", "prompt": "hi", "model": NAME}))
        error = receive(ws)
        assert error["field"] == "$.model" and "embeds; it does not generate" in error["message"]
        ws.send(config("Once upon a time", max_tokens=2))
        assert receive(ws)["type"] == "init"
    rest = web.post(embedding_server.http + "/v1/generate", json={"prompt": "hi", "model": NAME})
    assert rest.status_code == 422 and rest.json()["field"] == "$.model", rest.text  # its 4xx


def test_each_embedding_model_has_its_metrics(embedding_server: RunningServer) -> None:
    """/metrics counts an embedding model's requests, texts and tokens by its name."""

    def figure(name: str, **labels: str) -> float:
        text = web.get(embedding_server.http + "/metrics").text
        wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in text.splitlines():
            if line.startswith(f"{name}{{") and _labels(line) == wanted:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    before = figure("gateway_model_requests_total", model=NAME, outcome="ok", task="embed")
    texts = figure("gateway_model_inputs_total", model=NAME)
    timed = figure("gateway_model_request_seconds_count", model=NAME)
    oai = openai.OpenAI(api_key="k", base_url=embedding_server.http + "/v1", max_retries=0)
    used = oai.embeddings.create(model=NAME, input=["one text", "and another"]).usage
    assert figure("gateway_model_requests_total", model=NAME, outcome="ok", task="embed") == (
        before + 1
    )
    assert figure("gateway_model_inputs_total", model=NAME) == texts + 2
    assert figure("gateway_model_tokens_total", model=NAME) >= used.prompt_tokens
    assert figure("gateway_model_request_seconds_count", model=NAME) == timed + 1


def _labels(line: str) -> str:
    inside = line[line.index("{") + 1 : line.index("}")]
    return ",".join(sorted(inside.split(",")))
