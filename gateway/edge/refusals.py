"""What is refused before any route runs (a missing key, a body too large, a page from another
origin, a server shutting down, a path no route serves), in the error shape of the protocol the
path belongs to."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from gateway.edge.http_errors import status_of
from gateway.observability.tracing import refused
from protocols import (
    anthropic_answers,
    cohere,
    control,
    lmi,
    lmi_adapters,
    ollama_answers,
    openai_answers,
    rest_generate,
    tgi,
)
from protocols.errors import GenerationError, invalid, named

CLOSE_POLICY_VIOLATION = 1008  # a WebSocket refused: no key, or a page of another origin
_OPENAI = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/models",
    "/tokenize",
    "/detokenize",
)
_LMI = ("/invocations", "/predictions/", "/endpoints/")  # and /models/{model}/invoke
_TGI = frozenset({"/", "/generate", "/generate_stream", "/info"})
_DJL_MANAGEMENT = ("/adapters", "/models/")  # DJL's adapter API, which has its own error shape
# Ollama's API: every /api/ path but the gateway's own REST routes (/api/generate-one, -batch)
_REST = ("/api/generate-one", "/api/generate-batch")


def error_body(path: str, error: GenerationError) -> tuple[int, bytes]:
    """The status and body the route at `path` answers `error` with. A protocol's paths each
    need their branch here (tests/test_protocol_tables.py): one without answers in the REST
    routes' shape. The request's trace fails with the error's kind."""
    refused(error)
    if path.startswith("/v1/messages"):
        return anthropic_answers.error_of(error)
    if path.startswith("/api/") and path not in _REST:
        return ollama_answers.error_of(error)
    if path.startswith("/v2/"):
        return cohere.error_of(error)
    if path.startswith(_OPENAI) or (path.startswith("/v1/") and path != "/v1/generate"):
        return openai_answers.error_of(error)  # an unknown /v1/ path too: OpenAI's clients
    if path.startswith(_LMI) or (path.startswith("/models/") and path.endswith("/invoke")):
        status = lmi.lmi_status(error.kind)
        return status, lmi.payload_error(named(error), status, dynamic=False)
    if path in _TGI:
        return tgi.error_body(error)
    if path == "/v1/generate":
        return status_of(error.kind), control.encode(control.error_message(error))
    return status_of(error.kind), rest_generate.encode_error(error)


def error_response(
    path: str,
    error: GenerationError,
    status: int | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """`status` overrides the protocol's own for the error's kind (413, for one)."""
    own, body = error_body(path, error)
    return Response(body, status or own, headers, media_type="application/json")


async def unrouted(request: Request, exc: Exception) -> Response:
    """A path no route serves (404) or a method its route does not take (405), in the shape of
    the protocol the path belongs to, not Starlette's plain text: a path-like id included
    (`/v1/responses/..%2Fx`, which uvicorn decodes into more segments than the route has)."""
    assert isinstance(exc, HTTPException)
    path, status = request.url.path, exc.status_code
    if status == 404:
        message = f"Nothing is served at {request.method} {path}"
    else:
        message = f"{request.method} is not allowed on {path}"
    if path.startswith(_DJL_MANAGEMENT):
        kind = "ResourceNotFoundException" if status == 404 else "MethodNotAllowedException"
        body = lmi_adapters.error_body(status, message, kind)
        return Response(body, status, exc.headers, media_type="application/json")
    return error_response(path, invalid(message), status, dict(exc.headers or {}))


async def close_websocket(
    scope: Scope,
    receive: Receive,
    send: Send,
    code: int,
    reason: str,
    subprotocol: str | None = None,
) -> None:
    """Accept, then close with `code`: a browser sees the code and reason (a refused handshake
    would show it neither)."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    accept: Message = {"type": "websocket.accept"}
    if subprotocol is not None:
        accept["subprotocol"] = subprotocol
    await send(accept)
    await send({"type": "websocket.close", "code": code, "reason": reason})
