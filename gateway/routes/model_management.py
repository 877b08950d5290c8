"""DJL Serving's model management API (protocols/djl_models.py) over the model registry
(gateway/engine_path/model_registry.py): register loads an embedding model on an engine of its
own, once its memory is known to fit, or adds a chat model loaded on demand
(docs/MODELS.md); unregister stops it; list and describe read every model served, the chat
models included. Only a key of ADMIN_API_KEYS may call them
(gateway/http/admin.py), as the adapter management routes."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.engine_path.model_registry import Entry, ModelRefused, ModelRegistry, Task
from gateway.http.admin import djl_admin_refusal, djl_error, djl_json
from gateway.http.openapi import Op, Schema
from gateway.http.prepared import JSON, Prepared, Whole, to_response
from gateway.state import gateway_of
from protocols.djl_models import (
    DESCRIBE_STATUS,
    LIST_STATUS,
    DescribedModel,
    ListedModel,
    ModelList,
    Workflow,
    registration,
    registration_in_body,
    status_line,
    unregistered,
)
from protocols.errors import GenerationError
from protocols.lmi_adapters import (
    LIST_PARAMETERS,
    ErrorResponse,
    Status,
    only,
    page,
)

_KINDS = {400: "BadRequestException", 404: "ModelNotFoundException", 409: "BadRequestException"}


def _error(status: int, message: str) -> Whole:
    kind = _KINDS.get(status, "ServiceUnavailableException" if status == 507 else "ServerError")
    return djl_error(status, message, kind)


def _registry(request: Request) -> ModelRegistry | Whole:
    return djl_admin_refusal(request) or gateway_of(request).models


async def models(request: Request) -> Response:
    """GET lists, POST registers."""
    return to_response(await _models(request))


async def _models(request: Request) -> Prepared:
    registry = _registry(request)
    if isinstance(registry, Whole):
        return registry
    query = dict(request.query_params)
    try:
        if request.method == "GET":
            only(query, LIST_PARAMETERS)
            entries = registry.entries()
            first, last = page(query, len(entries))
            listed = ModelList([_listed(e) for e in entries[first:last]])
            if last < len(entries):
                listed.nextPageToken = str(last)
            return djl_json(listed)
        body = await request.body()
        if body:  # SageMaker's multi-model contract: the parameters in a JSON body
            only(query, frozenset())
            call = registration_in_body(body)
        else:
            call = registration(query)
        task: Task | None = (
            "generate" if call.task == "generate" else "embed" if call.task else None
        )
        await registry.register(call.name, call.url, synchronous=call.synchronous, task=task)
    except GenerationError as e:
        return _error(400, e.message)
    except ModelRefused as e:
        return _error(e.status, e.message)
    scheduled = not call.synchronous
    return djl_json(Status(status_line(call.name, scheduled=scheduled)), 202 if scheduled else 200)


async def model(request: Request) -> Response:
    """GET describes, DELETE unregisters."""
    return to_response(await _model(request))


async def _model(request: Request) -> Prepared:
    registry = _registry(request)
    if isinstance(registry, Whole):
        return registry
    name = request.path_params["model_name"]
    if request.method == "GET":
        found = [e for e in registry.entries() if e.name == name]
        if not found:
            return _error(404, f'Model or workflow not found: "{name}"')
        return djl_json([Workflow(name, [_described(found[0])])])
    try:
        await registry.unregister(name)
    except ModelRefused as e:
        return _error(e.status, e.message)
    return djl_json(Status(unregistered(name)))


def _listed(entry: Entry) -> ListedModel:
    return ListedModel(entry.name, entry.source, LIST_STATUS[entry.status], entry.task)


def _described(entry: Entry) -> DescribedModel:
    status = DESCRIBE_STATUS[entry.status]
    return DescribedModel(entry.name, entry.source, status, entry.loaded_at_startup, entry.task)


routes = [
    Route("/models", models, methods=["GET", "POST"]),
    Route("/models/{model_name}", model, methods=["GET", "DELETE"]),
]

STRING: Schema = {"type": "string"}
# 401 and 403: no key, or not an admin's; 409 a name in use; 507 a load that does not fit
ERRORS = (400, 401, 403, 404, 409, 413, 500, 507)


def _op(method: str, path: str, summary: str, answer: Any, query: Any = ()) -> Op:
    return Op(method, path, summary, None, {JSON: answer}, ErrorResponse, ERRORS, query)


_REGISTER = (
    ("url", STRING),
    ("model_name", STRING),
    ("synchronous", {"type": "string", "enum": ["true", "false"]}),
    ("task", {"type": "string", "enum": ["generate", "embed"]}),
)
_LISTING = (("limit", {"type": "integer"}), ("next_page_token", {"type": "integer"}))
operations = [
    _op("get", "/models", "DJL: list the models served (ADMIN_API_KEYS)", ModelList, _LISTING),
    _op(
        "post",
        "/models",
        "DJL: register a chat or embedding model (ADMIN_API_KEYS); SageMaker multi-model endpoints "
        'send the parameters as a JSON body instead, {"model_name": ..., "url": ...}',
        Status,
        _REGISTER,
    ),
    _op("get", "/models/{model_name}", "DJL: describe a model (ADMIN_API_KEYS)", list[Workflow]),
    _op("delete", "/models/{model_name}", "DJL: unregister a model (ADMIN_API_KEYS)", Status),
]
