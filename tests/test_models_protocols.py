"""Every protocol's model field reaches its model (docs/MODELS.md, "What each protocol
names"): one gateway serving SmolLM2 (`smol`, the default, the session's engine), the tiny
random Llama (`tiny`, gateway_bench/tiny_llama.py, loaded on its first request on an engine
of its own) and the embedding model. A greedy request naming `tiny` through each protocol's
real client gives tiny's own greedy text, which is not SmolLM2's: chat protocols are compared
with OpenAI chat's answer to the same messages, raw-prompt protocols with OpenAI completions'
answer to the same prompt. Then tools and constraints on `tiny`, and one key's concurrency
limit across the two models."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anthropic
import cohere
import openai
import pytest
from control_client import until
from huggingface_hub import InferenceClient

from clients import (
    CHAT,
    CITY_SCHEMA,
    UNENDING,
    connect,
    events_of,
    frames_until_done,
    payload,
    sagemaker_runtime,
    wait_ready,
    web,
)
from serving import SCRATCH, LoopThread, RunningServer, free_port, gateway_settings, shared_loader

if TYPE_CHECKING:
    from gateway.engine.pooling_engine import PoolingEngine
    from gateway.engine.vllm_engine import VllmEngine

pytestmark = [pytest.mark.engine, pytest.mark.own_engine]

TINY, SMOL, EMBEDDER = "tiny", "smol", "all-MiniLM-L6-v2"
TINY_CONTEXT = 1024  # not the default model's: /tokenize's `max_model_len` tells them apart
ASKED = "Tell me about lighthouses."
MESSAGES: Any = [{"role": "user", "content": ASKED}]
PROMPT = CHAT.format(ASKED)  # a raw prompt (no default system message: not the chat's)
TOKENS = 8
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def _models_file() -> Path:
    from gateway_bench.tiny_llama import tiny_llama_dir

    path = SCRATCH / "protocols-models.toml"
    path.write_text(
        f"""
default = "{SMOL}"
[models.{SMOL}]
source = "default"
[models.{TINY}]
source = "{tiny_llama_dir()}"
kv_cache_gib = 0.25
max_model_len = {TINY_CONTEXT}
keep_alive = -1
"""
    )
    return path


def _server(
    loop_thread: LoopThread, engine: VllmEngine, embedding_engine: PoolingEngine, **env: str
) -> RunningServer:
    """smol on the session's engine, tiny loaded on demand, the session's embedding model."""
    from gateway.app import create_app

    async def load_embedding() -> PoolingEngine:
        return embedding_engine

    settings = gateway_settings(
        MODELS_FILE=str(_models_file()),
        EMBEDDING_MODEL="default",
        EMBEDDING_DTYPE="float32",
        **env,
    )
    app = create_app(
        settings, shared_loader(engine), owns_engine=False, load_embedding=load_embedding
    )
    running = RunningServer(loop_thread, app, settings, free_port())
    wait_ready(running.http)
    return running


@pytest.fixture(scope="module")
def models_server(
    loop_thread: LoopThread, engine: VllmEngine, embedding_engine: PoolingEngine
) -> Iterator[RunningServer]:
    running = _server(loop_thread, engine, embedding_engine)
    yield running
    running.stop()


def _openai(server: RunningServer, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.http + "/v1", api_key=key, max_retries=0)


def _anthropic(server: RunningServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.http, api_key="unused", max_retries=0)


def _cohere(server: RunningServer) -> cohere.ClientV2:
    return cohere.ClientV2("unused", base_url=server.http, max_retries=0, timeout=None)


def _chat_text(server: RunningServer, model: str) -> str:
    answer = _openai(server).chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=TOKENS, temperature=0
    )
    assert answer.model == model
    text = answer.choices[0].message.content
    assert text
    return text


def _completion_text(server: RunningServer, model: str) -> str:
    answer = _openai(server).completions.create(
        model=model, prompt=PROMPT, max_tokens=TOKENS, temperature=0
    )
    assert answer.model == model
    text = answer.choices[0].text
    assert text
    return text


@pytest.fixture(scope="module")
def chat_reference(models_server: RunningServer) -> str:
    """tiny's greedy answer to MESSAGES (OpenAI chat), which is not smol's."""
    tiny = _chat_text(models_server, TINY)
    assert tiny == _chat_text(models_server, TINY)
    assert tiny != _chat_text(models_server, SMOL)
    return tiny


@pytest.fixture(scope="module")
def prompt_reference(models_server: RunningServer) -> str:
    """tiny's greedy continuation of PROMPT (OpenAI completions), which is not smol's."""
    tiny = _completion_text(models_server, TINY)
    assert tiny != _completion_text(models_server, SMOL)
    return tiny


# --- chat protocols: `model` -------------------------------------------------------------------


def test_openai_chat_and_completions_name_their_model(
    models_server: RunningServer, chat_reference: str, prompt_reference: str
) -> None:
    assert chat_reference != prompt_reference  # the chat's template is not the raw prompt
    listed = {m.id: m.model_extra or {} for m in _openai(models_server).models.list()}
    assert listed[TINY]["state"] == "loaded"
    # The protocol's own field wins over the header
    answer = web.post(
        models_server.http + "/v1/chat/completions",
        json={"model": TINY, "messages": MESSAGES, "max_tokens": TOKENS, "temperature": 0},
        headers={"X-Model": SMOL},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == chat_reference


def test_responses_name_their_model(models_server: RunningServer, chat_reference: str) -> None:
    client = _openai(models_server)
    answer = client.responses.create(
        model=TINY, input=MESSAGES, max_output_tokens=TOKENS, temperature=0
    )
    assert answer.model == TINY and answer.output_text == chat_reference
    on_smol = client.responses.create(
        model=SMOL, input=MESSAGES, max_output_tokens=TOKENS, temperature=0
    )
    assert on_smol.output_text != chat_reference
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(
            model=TINY,
            input="And then?",
            previous_response_id=on_smol.id,
            max_output_tokens=TOKENS,
            temperature=0,
        )
    assert refused.value.status_code == 400
    assert refused.value.param == "previous_response_id"


def test_anthropic_messages_name_their_model(
    models_server: RunningServer, chat_reference: str
) -> None:
    message = _anthropic(models_server).messages.create(
        model=TINY, max_tokens=TOKENS, messages=MESSAGES, extra_body={"temperature": 0}
    )
    assert message.model == TINY
    [block] = message.content
    assert block.type == "text" and block.text == chat_reference


def test_cohere_chat_names_its_model(models_server: RunningServer, chat_reference: str) -> None:
    answer = _cohere(models_server).chat(
        model=TINY, messages=MESSAGES, max_tokens=TOKENS, temperature=0
    )
    assert answer.message.content is not None
    [block] = answer.message.content
    assert block.type == "text" and block.text == chat_reference


def test_tokenize_names_its_model(models_server: RunningServer) -> None:
    def context(model: str) -> int:
        answer = web.post(models_server.http + "/tokenize", json={"model": model, "prompt": ASKED})
        assert answer.status_code == 200, answer.text
        return int(answer.json()["max_model_len"])

    assert context(TINY) == TINY_CONTEXT and context(SMOL) != TINY_CONTEXT


# --- LMI and SageMaker: the path, TargetModel, InferenceComponentName --------------------------

LMI_BODY = {"inputs": PROMPT, "parameters": {"max_new_tokens": TOKENS, "do_sample": False}}


def _lmi_text(server: RunningServer, path: str, **headers: str) -> str:
    answer = web.post(server.http + path, json=LMI_BODY, headers=headers)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["generated_text"])


def test_lmi_paths_name_their_model(models_server: RunningServer, prompt_reference: str) -> None:
    assert _lmi_text(models_server, f"/predictions/{TINY}") == prompt_reference
    assert _lmi_text(models_server, f"/models/{TINY}/invoke") == prompt_reference
    assert _lmi_text(models_server, "/invocations", **{"X-Model": TINY}) == prompt_reference
    assert _lmi_text(models_server, "/invocations") != prompt_reference  # the default's
    missing = web.post(models_server.http + "/predictions/no-such-model", json=LMI_BODY)
    assert missing.status_code == 404


def test_an_lmi_chat_body_names_its_model(
    models_server: RunningServer, chat_reference: str
) -> None:
    body = {"model": TINY, "messages": MESSAGES, "max_tokens": TOKENS, "temperature": 0}
    answer = web.post(models_server.http + "/invocations", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == chat_reference


def test_sagemaker_target_model_and_component_name_their_model(
    models_server: RunningServer, prompt_reference: str
) -> None:
    client = sagemaker_runtime(models_server.http)
    body = json.dumps(LMI_BODY)
    targeted = client.invoke_endpoint(EndpointName="e", TargetModel=TINY, Body=body)
    assert json.loads(targeted["Body"].read())["generated_text"] == prompt_reference
    component = client.invoke_endpoint(EndpointName="e", InferenceComponentName=TINY, Body=body)
    assert json.loads(component["Body"].read())["generated_text"] == prompt_reference
    default = client.invoke_endpoint(EndpointName="e", Body=body)
    assert json.loads(default["Body"].read())["generated_text"] != prompt_reference


# --- the control protocol: config.model --------------------------------------------------------


def test_the_control_protocol_names_its_model(
    models_server: RunningServer, prompt_reference: str
) -> None:
    config = {
        "type": "config",
        "model": TINY,
        "prompt": PROMPT,
        "parameters": {"max_tokens": TOKENS, "temperature": 0},
    }
    with connect(models_server.ws + "/generate") as ws:
        ws.send(json.dumps(config))
        messages = until(ws, "completion", "error")
    init = next(m for m in messages if m["type"] == "init")
    assert init["model"] == TINY
    assert messages[-1]["type"] == "completion", messages[-1]
    assert messages[-1]["generated_text"] == prompt_reference
    rest = {"model": TINY, "prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0}
    answer = web.post(models_server.http + "/v1/generate", json=rest)
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == TINY
    assert answer.json()["generated_text"] == prompt_reference


# --- TGI: parameters.adapter_id ----------------------------------------------------------------


def test_tgi_adapter_id_names_its_model(
    models_server: RunningServer, prompt_reference: str
) -> None:
    tgi = InferenceClient(base_url=models_server.http)
    new_text: Any = {"max_new_tokens": TOKENS, "return_full_text": False}
    assert tgi.text_generation(PROMPT, adapter_id=TINY, **new_text) == prompt_reference
    streamed = tgi.text_generation(PROMPT, adapter_id=TINY, stream=True, **new_text)
    assert "".join(streamed) == prompt_reference
    assert tgi.text_generation(PROMPT, **new_text) != prompt_reference  # the default's
    info = web.get(models_server.http + f"/info?model={TINY}")
    assert info.status_code == 200 and info.json()["max_total_tokens"] == TINY_CONTEXT


# --- the batch protocols: X-Model, the `model` query parameter ---------------------------------


def test_ws_model_query_parameter_names_its_model(
    models_server: RunningServer, prompt_reference: str
) -> None:
    with connect(models_server.ws + f"/ws?model={TINY}") as ws:
        ws.send(payload(("protocols-ws-1", PROMPT), generation_config=_greedy()))
        frames = frames_until_done(ws, {"protocols-ws-1"})
    complete = events_of(frames, "protocols-ws-1")[-1]
    assert complete["type"] == "COMPLETE", complete
    assert complete["text"] == prompt_reference


def test_ws_events_model_query_parameter_names_its_model(
    models_server: RunningServer, prompt_reference: str
) -> None:
    start = {"type": "START", "id": "e1", "data": PROMPT, "parameters": _greedy()}
    with connect(models_server.ws + f"/ws/events?model={TINY}") as ws:
        ws.send(json.dumps([start]))
        events: list[dict[str, Any]] = []
        while not any(e["type"] in ("COMPLETE", "ERROR") for e in events):
            events += json.loads(ws.recv())
    assert events[-1]["type"] == "COMPLETE", events[-1]
    assert events[-1]["data"] == prompt_reference


def test_api_generate_x_model_names_its_model(
    models_server: RunningServer, prompt_reference: str
) -> None:
    def generated(request_id: str, **headers: str) -> str:
        body = {
            "request_id": request_id,
            "prompt": PROMPT,
            "stream_response": False,
            "generation_config": _greedy(),
        }
        answer = web.post(models_server.http + "/api/generate-one", json=body, headers=headers)
        assert answer.status_code == 200, answer.text
        return answer.text

    assert generated("protocols-api-1", **{"X-Model": TINY}) == prompt_reference
    assert generated("protocols-api-2") != prompt_reference


def _greedy() -> dict[str, Any]:
    return {"do_sample": False, "max_new_tokens": TOKENS}


# --- refusals: the embedding model, an unknown model --------------------------------------------


def test_a_chat_naming_the_embedding_model_is_400_naming_model(
    models_server: RunningServer,
) -> None:
    with pytest.raises(openai.BadRequestError) as by_openai:
        _openai(models_server).chat.completions.create(
            model=EMBEDDER, messages=MESSAGES, max_tokens=TOKENS
        )
    assert by_openai.value.param == "model"
    with pytest.raises(anthropic.BadRequestError) as by_anthropic:
        _anthropic(models_server).messages.create(
            model=EMBEDDER, max_tokens=TOKENS, messages=MESSAGES
        )
    assert "`model`" in by_anthropic.value.message
    with pytest.raises(cohere.BadRequestError) as by_cohere:
        _cohere(models_server).chat(model=EMBEDDER, messages=MESSAGES, max_tokens=TOKENS)
    assert by_cohere.value.status_code == 400 and "`model`" in json.dumps(by_cohere.value.body)


def test_an_unknown_model_is_each_familys_404(models_server: RunningServer) -> None:
    with pytest.raises(openai.NotFoundError) as by_openai:
        _openai(models_server).chat.completions.create(
            model="no-such-model", messages=MESSAGES, max_tokens=TOKENS
        )
    assert by_openai.value.param == "model" and "`tiny`" in by_openai.value.message
    with pytest.raises(anthropic.NotFoundError) as by_anthropic:
        _anthropic(models_server).messages.create(
            model="no-such-model", max_tokens=TOKENS, messages=MESSAGES
        )
    assert "`tiny`" in by_anthropic.value.message
    with pytest.raises(cohere.NotFoundError) as by_cohere:
        _cohere(models_server).chat(model="no-such-model", messages=MESSAGES, max_tokens=TOKENS)
    assert "`tiny`" in json.dumps(by_cohere.value.body)


# --- tools and constraints on the second model ------------------------------------------------


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_a_forced_tool_call_on_tiny_is_a_call(models_server: RunningServer, choice: Any) -> None:
    answer = _openai(models_server).chat.completions.create(
        model=TINY,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER],
        tool_choice=choice,
        max_tokens=200,
        temperature=0,
    )
    assert answer.model == TINY
    [call] = answer.choices[0].message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"city"} and isinstance(arguments["city"], str)


def test_a_json_schema_on_tiny_is_valid_json(models_server: RunningServer) -> None:
    answer = _openai(models_server).chat.completions.create(
        model=TINY,
        messages=[{"role": "user", "content": "Which city, and is it a capital?"}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True},
        },
        max_tokens=200,
        temperature=0,
    )
    assert answer.model == TINY and answer.choices[0].finish_reason == "stop"
    city = json.loads(answer.choices[0].message.content or "")
    assert set(city) == {"city", "is_capital"} and isinstance(city["is_capital"], bool)


# --- one key's limits count every model's prompts ---------------------------------------------


@pytest.fixture
def limited_server(
    loop_thread: LoopThread, engine: VllmEngine, embedding_engine: PoolingEngine
) -> Iterator[RunningServer]:
    running = _server(
        loop_thread, engine, embedding_engine, API_KEYS="k1", LIMIT_CONCURRENT_REQUESTS="1"
    )
    yield running
    running.stop()


def test_a_keys_one_slot_held_on_smol_refuses_tiny(limited_server: RunningServer) -> None:
    """One limiter for every model's prompts and the embeddings (each model's service once
    made its own: an empty Limiter is falsy, and `limiter or Limiter()` replaced it)."""
    endless = {
        "model": SMOL,
        "messages": MESSAGES,
        "max_tokens": UNENDING,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    key = {"Authorization": "Bearer k1"}
    url = limited_server.http + "/v1/chat/completions"
    with web.stream("POST", url, json=endless, headers=key) as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()  # kept: a closed line iterator closes the stream
        next(line for line in lines if line.startswith("data: "))
        client = _openai(limited_server, "k1")
        with pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(model=TINY, messages=MESSAGES, max_tokens=TOKENS)
        with pytest.raises(openai.RateLimitError):  # and its embeddings
            client.embeddings.create(model=EMBEDDER, input="A lighthouse.")
        assert next(line for line in lines if line.startswith("data: {"))  # smol still streams
    assert refused.value.status_code == 429
