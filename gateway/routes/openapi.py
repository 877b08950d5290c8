"""GET `/openapi.json`: an OpenAPI 3.1 document of every HTTP route.

Every schema is generated (`msgspec.json.schema_components`) from the Structs the routes
decode and encode, so the document cannot drift from the wire. Each route lists the error
statuses it answers, in its protocol's own error shape. WebSocket routes are not described
(OpenAPI has no way to); docs/PROTOCOLS.md does.
"""

from __future__ import annotations

from functools import cache
from importlib import metadata
from typing import Annotated, Any, NamedTuple

import msgspec
from msgspec import Meta
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.routes.health import Health
from gateway.routes.openai import _Models
from protocols import (
    control,
    eventstream,
    lmi,
    openai_answers,
    responses_answers,
    rest_generate,
    tgi,
    tokenize,
)
from protocols.batch_payload import PayloadSettings
from protocols.openai_requests import ChatRequest, CompletionRequest
from protocols.responses_requests import ResponsesRequest

Schema = dict[str, Any]
JSON = "application/json"
SSE = "text/event-stream"
TEXT: Schema = {"type": "string"}


class Events(NamedTuple):
    """A server-sent event stream whose events' `data` is JSON of this type; `done`: its last
    event's data is `[DONE]` instead (OpenAI's). Before OpenAPI 3.2, an SSE media type's
    schema describes one event."""

    data: Any
    done: bool = False


PROMPTS = "Each a {request_id, prompt} object; a bad one fails alone, in the 200 answer"


class _BatchPayload(PayloadSettings, forbid_unknown_fields=True, kw_only=True):
    """`/api/generate-batch`'s body (protocols/batch_payload.py)."""

    prompts: Annotated[list[Any], Meta(min_length=1, description=PROMPTS)]


class Op(NamedTuple):
    """One operation: its body's type, its 200 answers by media type, its errors' type and
    statuses (a media type maps to a type, or to a ready schema for text), and its query
    parameters (name, schema)."""

    method: str
    path: str
    summary: str
    body: Any
    ok: dict[str, Any]
    error: Any
    statuses: tuple[int, ...]
    query: tuple[tuple[str, Schema], ...] = ()


OPENAI_ERRORS = (400, 401, 404, 409, 413, 422, 429, 500, 503)
STORED_ERRORS = (400, 401, 404, 503)  # a stored response's: unknown (or another key's) is 404
GATEWAY_ERRORS = (401, 409, 413, 422, 429, 500, 503)  # edge/http_errors.py
# A tuple is a choice: `anyOf` in an answer, `oneOf` in a body (msgspec cannot express a
# union of untagged Structs).
LMI_ANSWER = (lmi.Answer, list[lmi.Answer], openai_answers.Answer)  # `messages`: a chat
# LMI's own bodies; a chat body's as /v1/chat/completions; a failed generation is a 424
# answer whose details say `error`.
LMI_ERROR = (lmi.PayloadError, lmi.HandlerFailure, *LMI_ANSWER, openai_answers.ErrorBody)
LMI_BODY = (lmi._Payload, ChatRequest)  # DJL's rule: a body holding `messages` is a chat
LMI_OK = {JSON: LMI_ANSWER, "application/jsonlines": TEXT, SSE: Events(lmi.Line)}
TGI_EVENTS = Events((tgi.StreamResponse, tgi.ErrorResponse))
TGI_ERRORS = (401, 413, 422, 424, 429, 503)


def _lmi(path: str) -> Op:
    statuses = (*OPENAI_ERRORS, 424)
    return Op("post", path, "LMI invocation", LMI_BODY, LMI_OK, LMI_ERROR, statuses)


def _sagemaker(path: str, ok: dict[str, Any]) -> Op:
    error = (eventstream.ModelError, lmi.PayloadError)  # 401 and 413 come before the handler
    return Op("post", path, "SageMaker runtime", LMI_BODY, ok, error, (401, 413, 424))


OPS = (
    Op("get", "/health", "Ready (200) or not (503)", None, {JSON: Health}, Health, (503,)),
    Op("get", "/ping", "Ready (200) or not (503)", None, {JSON: Health}, Health, (503,)),
    Op("get", "/metrics", "Prometheus metrics", None, {"text/plain": TEXT}, None, ()),
    Op(
        "get",
        "/openapi.json",
        "This document",
        None,
        {JSON: dict[str, Any]},
        rest_generate.ErrorBody,
        (401,),
    ),
    Op("get", "/ui", "The chat playground", None, {"text/html": TEXT}, None, ()),
    Op(
        "get",
        "/ui/{name}",
        "A playground asset",
        None,
        {"text/javascript": TEXT, "text/css": TEXT},
        None,
        (404,),
    ),
    Op(
        "post",
        "/v1/chat/completions",
        "OpenAI chat completions",
        ChatRequest,
        {JSON: openai_answers.Answer, SSE: Events(openai_answers.Answer, done=True)},
        openai_answers.ErrorBody,
        OPENAI_ERRORS,
    ),
    Op(
        "post",
        "/v1/completions",
        "OpenAI completions",
        CompletionRequest,
        {JSON: openai_answers.Answer, SSE: Events(openai_answers.Answer, done=True)},
        openai_answers.ErrorBody,
        OPENAI_ERRORS,
    ),
    Op(
        "get",
        "/v1/models",
        "The served model",
        None,
        {JSON: _Models},
        openai_answers.ErrorBody,
        (401,),
    ),
    Op(
        "post",
        "/v1/responses",
        "OpenAI Responses API: one turn, whole or as typed events",
        ResponsesRequest,
        {JSON: responses_answers.ResponseObject, SSE: Events(responses_answers.ResponseEvent)},
        openai_answers.ErrorBody,
        OPENAI_ERRORS,
    ),
    Op(
        "get",
        "/v1/responses/{response_id}",
        "A stored response; with stream=true, a background response's events after starting_after",
        None,
        {JSON: responses_answers.ResponseObject, SSE: Events(responses_answers.ResponseEvent)},
        openai_answers.ErrorBody,
        STORED_ERRORS,
        (
            ("stream", {"type": "boolean"}),
            ("starting_after", {"type": "integer", "minimum": -1}),
        ),
    ),
    Op(
        "delete",
        "/v1/responses/{response_id}",
        "Delete a stored response",
        None,
        {JSON: responses_answers.DeletedResponse},
        openai_answers.ErrorBody,
        STORED_ERRORS,
    ),
    Op(
        "post",
        "/v1/responses/{response_id}/cancel",
        "Cancel a background response",
        None,
        {JSON: responses_answers.ResponseObject},
        openai_answers.ErrorBody,
        (*STORED_ERRORS, 409),
    ),
    Op(
        "get",
        "/v1/responses/{response_id}/input_items",
        "A stored response's input items",
        None,
        {JSON: responses_answers.InputItems},
        openai_answers.ErrorBody,
        STORED_ERRORS,
    ),
    Op(
        "post",
        "/tokenize",
        "vLLM's tokenize: a prompt, or messages in the chat template",
        tokenize.TokenizeRequest,
        {JSON: tokenize.TokenizeResponse},
        openai_answers.ErrorBody,
        (400, 401, 404, 413, 503),
    ),
    Op(
        "post",
        "/detokenize",
        "vLLM's detokenize",
        tokenize.DetokenizeRequest,
        {JSON: tokenize.DetokenizeResponse},
        openai_answers.ErrorBody,
        (400, 401, 404, 413, 503),
    ),
    _lmi("/invocations"),
    _lmi("/predictions/{model_name}"),
    _sagemaker("/endpoints/{name}/invocations", {"*/*": {}}),
    _sagemaker(
        "/endpoints/{name}/invocations-response-stream",
        {eventstream.MEDIA_TYPE: {"type": "string", "contentEncoding": "binary"}},
    ),
    # TGI: a streamed request answers 200 whatever happens, its error an SSE event.
    Op(
        "post",
        "/",
        "TGI: `stream` picks the form",
        tgi._Payload,
        {JSON: list[tgi.GenerateResponse], SSE: TGI_EVENTS},
        tgi.ErrorResponse,
        TGI_ERRORS,
    ),
    Op(
        "post",
        "/generate",
        "TGI generate",
        tgi._Payload,
        {JSON: tgi.GenerateResponse},
        tgi.ErrorResponse,
        TGI_ERRORS,
    ),
    Op(
        "post",
        "/generate_stream",
        "TGI stream",
        tgi._Payload,
        {SSE: TGI_EVENTS},
        tgi.ErrorResponse,
        (401, 413),
    ),
    Op("get", "/info", "TGI model info", None, {JSON: tgi.Info}, tgi.ErrorResponse, (401,)),
    Op(
        "post",
        "/api/generate-one",
        "One prompt, as plain text",
        rest_generate._OnePayload,
        {"text/plain": TEXT},
        rest_generate.ErrorBody,
        GATEWAY_ERRORS,
    ),
    Op(
        "post",
        "/api/generate-batch",
        "Several prompts, one JSON answer",
        _BatchPayload,
        {JSON: list[rest_generate.BatchAnswer]},
        rest_generate.ErrorBody,
        GATEWAY_ERRORS,
    ),
    Op(
        "post",
        "/v1/generate",
        "The control protocol's REST form",
        control.RestRequest,
        {JSON: control.RestResponse, SSE: Events(control.ServerMessage)},
        control.Error,
        GATEWAY_ERRORS,
    ),
)


def _content(by_media: dict[str, Schema]) -> Schema:
    return {media: {"schema": schema} for media, schema in by_media.items()}


def _types(op: Op) -> list[Any]:
    """The Structs and types an operation's schemas are made of."""
    found: list[Any] = []
    for t in (op.body, op.error, *op.ok.values()):
        if isinstance(t, Events):
            t = t.data
        if isinstance(t, tuple):
            found += t
        elif t is not None and not isinstance(t, dict):
            found.append(t)
    return found


def _operation(op: Op, refs: dict[Any, Schema]) -> Schema:
    def schema(t: Any, choice: str = "anyOf") -> Schema:
        if isinstance(t, Events):
            data: Schema = {
                "type": "string",
                "contentMediaType": JSON,
                "contentSchema": schema(t.data),
            }
            if t.done:
                data = {"anyOf": [data, {"const": "[DONE]"}]}
            return {"type": "object", "properties": {"data": data}, "required": ["data"]}
        if isinstance(t, tuple):
            return {choice: [refs[alternative] for alternative in t]}
        return t if isinstance(t, dict) else refs[t]

    ok = {media: schema(t) for media, t in op.ok.items()}
    responses: Schema = {"200": {"description": "OK", "content": _content(ok)}}
    for status in op.statuses:
        content = _content({JSON: schema(op.error)}) if op.error is not None else {}
        responses[str(status)] = {"description": "Error", "content": content}
    operation: Schema = {"summary": op.summary, "responses": responses}
    names = [part[1:-1] for part in op.path.split("/") if part.startswith("{")]
    parameters = [
        {"name": n, "in": "path", "required": True, "schema": {"type": "string"}} for n in names
    ]
    parameters += [{"name": n, "in": "query", "schema": s} for n, s in op.query]
    if parameters:
        operation["parameters"] = parameters
    if op.body is not None:
        body = _content({JSON: schema(op.body, "oneOf")})
        operation["requestBody"] = {"required": True, "content": body}
    return operation


@cache
def document() -> bytes:
    types = list(dict.fromkeys(t for op in OPS for t in _types(op)))
    schemas, components = msgspec.json.schema_components(
        types, ref_template="#/components/schemas/{name}"
    )
    refs = dict(zip(types, schemas, strict=True))
    paths: dict[str, Schema] = {}
    for op in OPS:
        paths.setdefault(op.path, {})[op.method] = _operation(op, refs)
    doc = {
        "openapi": "3.1.0",
        "info": {"title": "llm-gateway", "version": _version()},
        "paths": paths,
        "components": {"schemas": components},
    }
    return msgspec.json.encode(doc)


def _version() -> str:
    try:
        return metadata.version("llm-gateway")
    except metadata.PackageNotFoundError:
        return "0.1.0"


async def openapi(request: Request) -> Response:
    return Response(document(), media_type=JSON)


routes = [Route("/openapi.json", openapi, methods=["GET"])]
