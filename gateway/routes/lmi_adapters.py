"""LMI's (DJL Serving's) adapter management routes (protocols/lmi_adapters.py) over the served
model's adapters: register loads one, unregister unloads it, list and describe read what is
served (ADAPTERS and those loaded since). Only a key of ADMIN_API_KEYS may call them, as the
vLLM-shaped routes (gateway/http/admin.py). A chat model's name as the `{model_name}` of
`/models/{model_name}/adapters` picks it (else the X-Model header's, else the default), as for
`/predictions/{model_name}` (docs/ADAPTERS.md, docs/MODELS.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.edge.http_errors import status_of
from gateway.engine_path.served_model import ServedModel
from gateway.http.admin import djl_admin_refusal, djl_error, djl_json
from gateway.http.model_choice import ModelRefused, asked_model, chat_model_for
from gateway.http.openapi import Op, Schema
from gateway.http.prepared import JSON, Prepared, Whole, to_response
from gateway.observability.tracing import refused
from gateway.state import gateway_of
from protocols.errors import ErrorKind, GenerationError
from protocols.lmi_adapters import (
    LIST_PARAMETERS,
    REGISTER_PARAMETERS,
    UPDATE_PARAMETERS,
    AdapterItem,
    AdapterList,
    ErrorResponse,
    Status,
    djl_field,
    load_options,
    not_found,
    only,
    page,
    required,
)


def _error(status: int, message: str) -> Whole:
    return djl_error(status, message, "BadRequestException")


def _failed(error: GenerationError) -> Whole:
    """DJL's BadRequestException (400) for what the caller sent; the engine's own failures
    as the gateway's REST routes answer them (500, 503)."""
    refused(error)
    status = 400 if error.kind == ErrorKind.INVALID_REQUEST else status_of(error.kind)
    return _error(status, error.message)


async def _model(request: Request) -> ServedModel | Whole:
    """The served model, once the caller is an admin and LoRA is on; else DJL's refusal."""
    refusal = djl_admin_refusal(request)
    if refusal is not None:
        return refusal
    gateway = gateway_of(request)
    named = gateway.chats.named(request.path_params.get("model_name", ""))
    chosen = named or chat_model_for(gateway, asked_model(request, None))
    if isinstance(chosen, ModelRefused):
        return _error(chosen.status, chosen.error.message)
    model = chosen.served
    if not await model.adapters_enabled():
        return _error(400, "LoRA is not enabled.")
    return model


async def _named_adapter(request: Request) -> tuple[ServedModel, AdapterItem] | Whole:
    """The served model and the adapter the path names, once it is served; else DJL's
    refusal."""
    model = await _model(request)
    if isinstance(model, Whole):
        return model
    name = request.path_params["adapter_name"]
    path = await model.adapter_path(name)
    if path is None:
        return Whole(404, not_found(name), JSON)
    return model, AdapterItem(name, str(path))


async def adapters(request: Request) -> Response:
    """GET lists, POST registers."""
    return to_response(await _adapters(request))


async def _adapters(request: Request) -> Prepared:
    model = await _model(request)
    if isinstance(model, Whole):
        return model
    query = dict(request.query_params)
    try:
        if request.method == "GET":
            only(query, LIST_PARAMETERS)
            paths = model.adapter_paths()
            names = list(paths)
            first, last = page(query, len(names))
            listed = AdapterList([AdapterItem(n, str(paths[n])) for n in names[first:last]])
            if last < len(names):
                listed.nextPageToken = str(last)
            return djl_json(listed)
        only(query, REGISTER_PARAMETERS)
        name, src = required(query, "name"), required(query, "src")
        load_options(query)
        await model.load_adapter(name, Path(src))
    except GenerationError as e:
        return _failed(djl_field(e))
    return djl_json(Status(f"Adapter {name} registered"))


async def adapter(request: Request) -> Response:
    """GET describes, DELETE unregisters."""
    return to_response(await _adapter(request))


async def _adapter(request: Request) -> Prepared:
    named = await _named_adapter(request)
    if isinstance(named, Whole):
        return named
    model, found = named
    if request.method == "GET":
        return djl_json(found)
    try:
        unloaded = await model.unload_adapter(found.name)
    except GenerationError as e:
        return _failed(djl_field(e))
    if not unloaded:  # unloaded meanwhile by another call
        return Whole(404, not_found(found.name), JSON)
    return djl_json(Status(f"Adapter {found.name} unregistered"))


async def update(request: Request) -> Response:
    """DJL's update changes `preload` and `pin` (the gateway has neither to change) and
    refuses a new `src`, as DJL's vLLM handler does."""
    return to_response(await _update(request))


async def _update(request: Request) -> Prepared:
    named = await _named_adapter(request)
    if isinstance(named, Whole):
        return named
    _, found = named
    query = dict(request.query_params)
    try:
        only(query, UPDATE_PARAMETERS)
        load_options(query)
    except GenerationError as e:
        return _failed(e)
    src = query.get("src")
    if src and Path(src) != Path(found.src):
        message = "Updating adapter path is not supported: unregister it and register it again"
        return _error(400, message)
    return djl_json(Status(f"Adapter {found.name} updated"))


def _routes(prefix: str) -> list[Route]:
    return [
        Route(f"{prefix}/adapters", adapters, methods=["GET", "POST"]),
        Route(f"{prefix}/adapters/{{adapter_name}}", adapter, methods=["GET", "DELETE"]),
        Route(f"{prefix}/adapters/{{adapter_name}}/update", update, methods=["POST"]),
    ]


routes = _routes("") + _routes("/models/{model_name}")

STRING: Schema = {"type": "string"}
FLAG: Schema = {"type": "string", "enum": ["true", "false"]}
LOAD = (("preload", FLAG), ("pin", FLAG))
# 401 and 403: no key, or not an admin's; 400 also when LoRA is off; 503 while the engine loads
ERRORS = (400, 401, 403, 404, 413, 500, 503)


def _operations(prefix: str) -> list[Op]:
    def op(method: str, path: str, summary: str, answer: Any, query: Any = ()) -> Op:
        ok = {JSON: answer}
        return Op(method, prefix + path, summary, None, ok, ErrorResponse, ERRORS, query)

    listing = (("limit", {"type": "integer"}), ("next_page_token", {"type": "integer"}))
    register = (("name", STRING), ("src", STRING), *LOAD)
    one = "/adapters/{adapter_name}"
    return [
        op("get", "/adapters", "LMI: list the adapters (ADMIN_API_KEYS)", AdapterList, listing),
        op("post", "/adapters", "LMI: register an adapter (ADMIN_API_KEYS)", Status, register),
        op("get", one, "LMI: describe an adapter (ADMIN_API_KEYS)", AdapterItem),
        op("delete", one, "LMI: unregister an adapter (ADMIN_API_KEYS)", Status),
        op(
            "post",
            one + "/update",
            "LMI: update an adapter (ADMIN_API_KEYS)",
            Status,
            (("src", STRING), *LOAD),
        ),
    ]


operations = _operations("") + _operations("/models/{model_name}")
