"""The OpenAPI 3.1 document of every HTTP route, from the operations each route module
declares beside its `routes` (`operations`, gathered by gateway/routes/__init__.py).

Every schema is generated (`msgspec.json.schema_components`) from the Structs the routes
decode and encode, so the document cannot drift from the wire. Each operation lists the error
statuses it answers, in its protocol's own error shape. WebSocket routes are not described
(OpenAPI has no way to); docs/PROTOCOLS.md does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import msgspec

from gateway.config.version import version
from gateway.http.prepared import JSON

Schema = dict[str, Any]
TEXT: Schema = {"type": "string"}

OPENAI_ERRORS = (400, 401, 404, 409, 413, 422, 429, 500, 503)
GATEWAY_ERRORS = (401, 409, 413, 422, 429, 500, 503)  # edge/http_errors.py


class Events(NamedTuple):
    """A server-sent event stream whose events' `data` is JSON of this type; `done`: its last
    event's data is `[DONE]` instead (OpenAI's). Before OpenAPI 3.2, an SSE media type's
    schema describes one event."""

    data: Any
    done: bool = False


class Op(NamedTuple):
    """One operation: its body's type, its 200 answers by media type, its errors' type and
    statuses (a media type maps to a type, or to a ready schema for text), and its query
    parameters (name, schema). A tuple of types is a choice: `anyOf` in an answer, `oneOf` in
    a body (msgspec cannot express a union of untagged Structs)."""

    method: str
    path: str
    summary: str
    body: Any
    ok: dict[str, Any]
    error: Any
    statuses: tuple[int, ...]
    query: tuple[tuple[str, Schema], ...] = ()


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


def document(operations: Iterable[Op]) -> bytes:
    ops = list(operations)
    types = list(dict.fromkeys(t for op in ops for t in _types(op)))
    schemas, components = msgspec.json.schema_components(
        types, ref_template="#/components/schemas/{name}"
    )
    refs = dict(zip(types, schemas, strict=True))
    paths: dict[str, Schema] = {}
    for op in ops:
        paths.setdefault(op.path, {})[op.method] = _operation(op, refs)
    doc = {
        "openapi": "3.1.0",
        "info": {"title": "llm-gateway", "version": version()},
        "paths": paths,
        "components": {"schemas": components},
    }
    return msgspec.json.encode(doc)
