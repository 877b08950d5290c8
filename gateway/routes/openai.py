"""OpenAI's API: POST `/v1/chat/completions` (also TGI's Messages API, which
`huggingface_hub.InferenceClient.chat_completion` calls), POST `/v1/completions`, GET
`/v1/models`. Their answers are prepared by gateway/http/chat.py."""

from __future__ import annotations

import time

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.http.chat import prepare
from gateway.http.openapi import OPENAI_ERRORS, Events, Op
from gateway.http.prepared import JSON, SSE, Whole, to_response
from gateway.state import gateway_of
from protocols.names import Protocol
from protocols.openai_answers import Answer, ErrorBody, Model, ModelList, not_found
from protocols.openai_requests import ChatRequest, CompletionRequest


async def chat_completions(request: Request) -> Response:
    raw = await request.body()
    return to_response(await prepare(request, raw, chat=True, protocol=Protocol.OPENAI_CHAT))


async def completions(request: Request) -> Response:
    raw = await request.body()
    protocol = Protocol.OPENAI_COMPLETIONS
    return to_response(await prepare(request, raw, chat=False, protocol=protocol))


_STATES = {"ready": "loaded", "loading": "loading", "unloaded": "unloaded", "failed": "failed"}


def _listed(request: Request) -> list[Model]:
    """Each chat model (the default first) with its adapters, then the embedding models (with
    their `task` and their engine's `status`: ready, loading or failed); every one with its
    `state` (loaded, loading, unloaded or failed); `created` is when this listing was made, as
    vLLM's server dates it."""
    gateway = gateway_of(request)
    now = int(time.time())
    listed = []
    chats = [gateway.chats.default, *(m for m in gateway.chats if m is not gateway.chats.default)]
    for chat in chats:
        model = chat.served
        context, state = model.context_length(), _STATES[model.status()[0]]
        listed.append(Model(id=model.name, max_model_len=context, created=now, state=state))
        listed += [
            Model(id=name, max_model_len=context, created=now, root=str(path), parent=model.name)
            for name, path in model.adapter_paths().items()
        ]
    for embedding in gateway.models.embedding_models():
        length = embedding.context_length() or 0
        status, _ = embedding.status()
        listed.append(
            Model(
                id=embedding.name,
                max_model_len=length,
                created=now,
                task=embedding.task,
                status=status,
                state=_STATES.get(status, status),
            )
        )
    return listed


async def models(request: Request) -> Response:
    return to_response(Whole(200, msgspec.json.encode(ModelList(data=_listed(request))), JSON))


async def one_model(request: Request) -> Response:
    """GET `/v1/models/{model}`: one of the listed, or OpenAI's 404 `model_not_found`."""
    wanted = request.path_params["model"]
    found = next((m for m in _listed(request) if m.id == wanted), None)
    if found is None:
        served = gateway_of(request).model.name
        why = f"The model `{wanted}` does not exist; this server serves `{served}` and its adapters"
        return to_response(Whole(404, not_found(why), JSON))
    return to_response(Whole(200, msgspec.json.encode(found), JSON))


routes = [
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/models", models, methods=["GET"]),
    Route("/v1/models/{model}", one_model, methods=["GET"]),
]
ANSWERS = {JSON: Answer, SSE: Events(Answer, done=True)}
operations = [
    Op(
        "post",
        "/v1/chat/completions",
        "OpenAI chat completions",
        ChatRequest,
        ANSWERS,
        ErrorBody,
        OPENAI_ERRORS,
    ),
    Op(
        "post",
        "/v1/completions",
        "OpenAI completions",
        CompletionRequest,
        ANSWERS,
        ErrorBody,
        OPENAI_ERRORS,
    ),
    Op("get", "/v1/models", "The served model", None, {JSON: ModelList}, ErrorBody, (401,)),
    Op("get", "/v1/models/{model}", "One served model", None, {JSON: Model}, ErrorBody, (401, 404)),
]
