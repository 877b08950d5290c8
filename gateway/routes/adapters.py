"""LoRA adapters loaded and unloaded at run time, in vLLM's request shapes: POST
`/v1/load_lora_adapter` (`{"lora_name", "lora_path"}`) and `/v1/unload_lora_adapter`
(`{"lora_name"}`), answered as vLLM answers them. Only a key of ADMIN_API_KEYS may call them
(none set: refused); API_KEYS' keys cannot (docs/ADAPTERS.md)."""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import NamedTuple

import msgspec
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from gateway.edge.api_keys import presented_key
from gateway.routes.prepared import JSON
from gateway.state import gateway_of
from protocols.errors import GenerationError
from protocols.openai_answers import ErrorBody, ErrorDetail, error_of
from protocols.openai_requests import decode_body

# Open to the API-key check (API_KEYS): these routes check ADMIN_API_KEYS themselves. LMI's
# adapter management routes (gateway/routes/lmi_adapters.py) are `/adapters...` and
# `/models/{model_name}/adapters...`; nothing else lives under `/models/`.
ADMIN_PATHS = frozenset(
    {"/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/adapters", "/adapters/*", "/models/*"}
)


class _Load(msgspec.Struct, forbid_unknown_fields=True):
    lora_name: str
    lora_path: str


class _Unload(msgspec.Struct, forbid_unknown_fields=True):
    lora_name: str
    lora_int_id: int | None = None  # vLLM's clients may send it; names are what count here


def _error(status: int, message: str, kind: str, param: str | None = None) -> Response:
    body = msgspec.json.encode(ErrorBody(ErrorDetail(message, kind, param, None)))
    return Response(body, status, media_type=JSON)


class Refusal(NamedTuple):
    status: int  # 401 or 403
    message: str
    kind: str  # OpenAI's error type


def admin_refusal(request: Request) -> Refusal | None:
    """None for a key of ADMIN_API_KEYS; else why not: 401 (no key) or 403 (a key that is not
    an admin's, or no ADMIN_API_KEYS at all). Every adapter management route asks this."""
    admins = [k.strip() for k in gateway_of(request).settings.admin_api_keys.split(",")]
    admins = [k for k in admins if k]
    if not admins:
        message = "Adapters are loaded at start-up only: ADMIN_API_KEYS names no admin key"
        return Refusal(403, message, "permission_error")
    key = presented_key(request.scope)
    if key is None:
        return Refusal(401, "An admin key is required (ADMIN_API_KEYS)", "authentication_error")
    if not any(hmac.compare_digest(key.encode(), a.encode()) for a in admins):
        return Refusal(403, "This key may not manage adapters", "permission_error")
    return None


def _refused(request: Request) -> Response | None:
    refusal = admin_refusal(request)
    return None if refusal is None else _error(*refusal)


async def load_lora_adapter(request: Request) -> Response:
    refused = _refused(request)
    if refused is not None:
        return refused
    try:
        body: _Load = decode_body(await request.body(), _Load)
        engine = await gateway_of(request).holder.wait()
        await engine.load_adapter(body.lora_name, Path(body.lora_path))
    except GenerationError as e:
        status, payload = error_of(e)
        return Response(payload, status, media_type=JSON)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


async def unload_lora_adapter(request: Request) -> Response:
    refused = _refused(request)
    if refused is not None:
        return refused
    try:
        body: _Unload = decode_body(await request.body(), _Unload)
        engine = await gateway_of(request).holder.wait()
        unloaded = await engine.unload_adapter(body.lora_name)
    except GenerationError as e:
        status, payload = error_of(e)
        return Response(payload, status, media_type=JSON)
    if not unloaded:
        message = f"The lora adapter '{body.lora_name}' cannot be found."
        return _error(404, message, "NotFoundError", "lora_name")
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


routes = [
    Route("/v1/load_lora_adapter", load_lora_adapter, methods=["POST"]),
    Route("/v1/unload_lora_adapter", unload_lora_adapter, methods=["POST"]),
]
