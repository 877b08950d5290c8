"""Answers the openai SDK's own types accept in strict mode: `/v1/models` and one model,
a chat completion and its chunks, a completion, an unknown `/v1/` path's error, and a
Responses API answer's usage (issue 46: what strict validation with openai's types found)."""

from __future__ import annotations

import json
from typing import Any

import openai
import pydantic
import pytest
from openai.types import Completion, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response

from clients import web
from serving import RunningServer

HI: Any = [{"role": "user", "content": "Hi"}]


def _strict(kind: Any, data: Any) -> Any:
    return pydantic.TypeAdapter(kind).validate_python(data, strict=True)


def test_models_and_one_model_validate(server: RunningServer) -> None:
    listed = web.get(server.http + "/v1/models").json()["data"]
    models = [_strict(Model, entry) for entry in listed]
    assert models[0].created > 0 and models[0].owned_by and models[0].object == "model"
    sdk = openai.OpenAI(base_url=server.http + "/v1", api_key="unused", max_retries=0)
    one = sdk.models.retrieve(models[0].id)
    assert one.id == models[0].id
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.models.retrieve("no-such-model")
    assert missing.value.code == "model_not_found"


def test_chat_completion_chunks_and_completion_validate(server: RunningServer) -> None:
    url = server.http + "/v1/chat/completions"
    whole = web.post(url, json={"messages": HI, "max_tokens": 4}).json()
    _strict(ChatCompletion, whole)
    streamed = web.post(url, json={"messages": HI, "max_tokens": 4, "stream": True})
    events = [
        line.removeprefix("data: ")
        for line in streamed.text.split("\n")
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    assert events
    for event in events:
        _strict(ChatCompletionChunk, json.loads(event))
    text = web.post(server.http + "/v1/completions", json={"prompt": "Hi", "max_tokens": 4})
    _strict(Completion, text.json())


def test_an_unknown_v1_path_is_openais_json_error(server: RunningServer) -> None:
    sdk = openai.OpenAI(base_url=server.http + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.audio.speech.create(model="m", input="x", voice="alloy")
    assert missing.value.body is not None
    assert "/v1/audio/speech" in missing.value.message


def test_a_responses_answer_validates(server: RunningServer) -> None:
    answer = web.post(
        server.http + "/v1/responses", json={"input": "Hi", "max_output_tokens": 4}
    ).json()
    response = _strict(Response, answer)
    assert response.usage is not None
    assert response.usage.input_tokens_details.cache_write_tokens == 0
