"""LoRA adapters loaded and unloaded at run time, in vLLM's request shapes
(protocols/lora_adapters.py): POST `/v1/load_lora_adapter` (`{"lora_name", "lora_path"}`) and
`/v1/unload_lora_adapter` (`{"lora_name"}`), answered as vLLM answers them. Only a key of
ADMIN_API_KEYS may call them (gateway/http/admin.py; docs/ADAPTERS.md)."""

from __future__ import annotations

from pathlib import Path

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.http.admin import admin_refusal
from gateway.http.chat import error_answer, openai_refusal
from gateway.http.model_choice import ModelRefused, asked_model, chat_model_for
from gateway.http.openapi import OPENAI_ERRORS, TEXT, Op
from gateway.http.prepared import JSON, Prepared, Whole, to_response
from gateway.state import gateway_of
from protocols.errors import GenerationError
from protocols.lora_adapters import (
    LoadLoraAdapter,
    UnloadLoraAdapter,
    loaded,
    not_loaded,
    unloaded,
)
from protocols.openai_answers import ErrorBody, ErrorDetail
from protocols.openai_requests import decode_body

PLAIN = "text/plain; charset=utf-8"


def _error(status: int, message: str, kind: str, param: str | None = None) -> Whole:
    body = msgspec.json.encode(ErrorBody(ErrorDetail(message, kind, param, None)))
    return Whole(status, body, JSON)


def _refused(request: Request) -> Whole | None:
    refusal = admin_refusal(request)
    return None if refusal is None else _error(*refusal)


async def load_lora_adapter(request: Request) -> Response:
    return to_response(await _load(request))


async def _load(request: Request) -> Prepared:
    refused = _refused(request)
    if refused is not None:
        return refused
    try:
        body: LoadLoraAdapter = decode_body(await request.body(), LoadLoraAdapter)
        chosen = chat_model_for(gateway_of(request), asked_model(request, None))
        if isinstance(chosen, ModelRefused):
            return openai_refusal(chosen)
        await chosen.served.load_adapter(body.lora_name, Path(body.lora_path))
    except GenerationError as e:
        return error_answer(e)
    return Whole(200, loaded(body.lora_name).encode(), PLAIN)


async def unload_lora_adapter(request: Request) -> Response:
    return to_response(await _unload(request))


async def _unload(request: Request) -> Prepared:
    refused = _refused(request)
    if refused is not None:
        return refused
    try:
        body: UnloadLoraAdapter = decode_body(await request.body(), UnloadLoraAdapter)
        chats = gateway_of(request).chats
        owner = chats.find(body.lora_name) if body.lora_name in chats.names() else None
        gone = await (owner or chats.default).served.unload_adapter(body.lora_name)
    except GenerationError as e:
        return error_answer(e)
    if not gone:
        return _error(404, not_loaded(body.lora_name), "NotFoundError", "lora_name")
    return Whole(200, unloaded(body.lora_name).encode(), PLAIN)


routes = [
    Route("/v1/load_lora_adapter", load_lora_adapter, methods=["POST"]),
    Route("/v1/unload_lora_adapter", unload_lora_adapter, methods=["POST"]),
]
# 401 and 403: no key, or not an admin's (OpenAI's authentication_error, permission_error)
ERRORS = tuple(sorted({*OPENAI_ERRORS, 403}))
operations = [
    Op(
        "post",
        "/v1/load_lora_adapter",
        "Load a LoRA adapter (vLLM's shape; ADMIN_API_KEYS)",
        LoadLoraAdapter,
        {"text/plain": TEXT},
        ErrorBody,
        ERRORS,
    ),
    Op(
        "post",
        "/v1/unload_lora_adapter",
        "Unload a LoRA adapter (vLLM's shape; ADMIN_API_KEYS)",
        UnloadLoraAdapter,
        {"text/plain": TEXT},
        ErrorBody,
        ERRORS,
    ),
]
