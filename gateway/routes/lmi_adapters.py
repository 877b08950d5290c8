"""LMI's (DJL Serving's) adapter management routes over the engine's adapters: register is
`VllmEngine.load_adapter`, unregister `VllmEngine.unload_adapter`, list and describe read what
the engine serves (ADAPTERS and those loaded since). Only a key of ADMIN_API_KEYS may call them,
as the vLLM-shaped routes (gateway/routes/adapters.py). The `{model_name}` of
`/models/{model_name}/adapters` is not checked, as for `/predictions/{model_name}`: one model
is served (docs/ADAPTERS.md)."""

from __future__ import annotations

from pathlib import Path

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.edge.http_errors import status_of
from gateway.engine.lora import Adapter
from gateway.engine.vllm_engine import VllmEngine
from gateway.routes.adapters import admin_refusal
from gateway.routes.prepared import JSON
from gateway.state import gateway_of
from protocols.errors import ErrorKind, GenerationError
from protocols.lmi_adapters import (
    LIST_PARAMETERS,
    REGISTER_PARAMETERS,
    UPDATE_PARAMETERS,
    AdapterItem,
    AdapterList,
    Status,
    djl_field,
    error_body,
    load_options,
    not_found,
    only,
    page,
    required,
)


def _json(value: object, status: int = 200) -> Response:
    return Response(msgspec.json.encode(value), status, media_type=JSON)


def _failed(error: GenerationError) -> Response:
    """DJL's BadRequestException (400) for what the caller sent; the engine's own failures
    as the gateway's REST routes answer them (500, 503)."""
    status = 400 if error.kind == ErrorKind.INVALID_REQUEST else status_of(error.kind)
    return Response(error_body(status, error.message), status, media_type=JSON)


async def _engine(request: Request) -> VllmEngine | Response:
    """The engine, once the caller is an admin and LoRA is on; else DJL's refusal."""
    refusal = admin_refusal(request)
    if refusal is not None:
        kind = "Unauthorized" if refusal.status == 401 else "Forbidden"
        body = error_body(refusal.status, refusal.message, kind)
        return Response(body, refusal.status, media_type=JSON)
    engine = await gateway_of(request).holder.wait()
    if not engine.adapters.enabled:
        return Response(error_body(400, "LoRA is not enabled."), 400, media_type=JSON)
    return engine


async def _named_adapter(request: Request) -> tuple[VllmEngine, Adapter] | Response:
    """The engine and the adapter the path names, once it is served; else DJL's refusal."""
    engine = await _engine(request)
    if isinstance(engine, Response):
        return engine
    name = request.path_params["adapter_name"]
    adapter = engine.adapters.find(name)
    if adapter is None:
        return Response(not_found(name), 404, media_type=JSON)
    return engine, adapter


def _item(adapter: Adapter) -> AdapterItem:
    return AdapterItem(adapter.name, str(adapter.path))


async def adapters(request: Request) -> Response:
    """GET lists, POST registers."""
    engine = await _engine(request)
    if isinstance(engine, Response):
        return engine
    query = dict(request.query_params)
    try:
        if request.method == "GET":
            only(query, LIST_PARAMETERS)
            names = engine.adapters.names
            first, last = page(query, len(names))
            listed = AdapterList([_item(engine.adapters.get(n, "name")) for n in names[first:last]])
            if last < len(names):
                listed.nextPageToken = str(last)
            return _json(listed)
        only(query, REGISTER_PARAMETERS)
        name, src = required(query, "name"), required(query, "src")
        load_options(query)
        await engine.load_adapter(name, Path(src))
    except GenerationError as e:
        return _failed(djl_field(e))
    return _json(Status(f"Adapter {name} registered"))


async def adapter(request: Request) -> Response:
    """GET describes, DELETE unregisters."""
    named = await _named_adapter(request)
    if isinstance(named, Response):
        return named
    engine, found = named
    if request.method == "GET":
        return _json(_item(found))
    try:
        unloaded = await engine.unload_adapter(found.name)
    except GenerationError as e:
        return _failed(djl_field(e))
    if not unloaded:  # unloaded meanwhile by another call
        return Response(not_found(found.name), 404, media_type=JSON)
    return _json(Status(f"Adapter {found.name} unregistered"))


async def update(request: Request) -> Response:
    """DJL's update changes `preload` and `pin` (the gateway has neither to change) and
    refuses a new `src`, as DJL's vLLM handler does."""
    named = await _named_adapter(request)
    if isinstance(named, Response):
        return named
    _, found = named
    query = dict(request.query_params)
    try:
        only(query, UPDATE_PARAMETERS)
        load_options(query)
    except GenerationError as e:
        return _failed(e)
    src = query.get("src")
    if src and Path(src) != found.path:
        message = "Updating adapter path is not supported: unregister it and register it again"
        return Response(error_body(400, message), 400, media_type=JSON)
    return _json(Status(f"Adapter {found.name} updated"))


def _routes(prefix: str) -> list[Route]:
    return [
        Route(f"{prefix}/adapters", adapters, methods=["GET", "POST"]),
        Route(f"{prefix}/adapters/{{adapter_name}}", adapter, methods=["GET", "DELETE"]),
        Route(f"{prefix}/adapters/{{adapter_name}}/update", update, methods=["POST"]),
    ]


routes = _routes("") + _routes("/models/{model_name}")
