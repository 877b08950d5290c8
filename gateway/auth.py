"""The API-key check in front of every route, written once (the keys: gateway/api_keys.py).

A request without a valid key never reaches its route: HTTP gets 401 in its protocol's own
error shape (OpenAI's error object, TGI's, LMI's, the control protocol's, the REST routes');
a WebSocket is accepted and closed at once with 1008, before any generation. A valid key's
name is left in the request's state (`request.state.api_key`) for what follows.
"""

from __future__ import annotations

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api_keys import SUBPROTOCOL_PREFIX, KeyRing, presented_key, subprotocol_key
from gateway.routes.http_errors import status_of
from protocols import control, lmi, openai_answers, rest_generate, tgi
from protocols.errors import ErrorKind, GenerationError, named

CLOSE_POLICY_VIOLATION = 1008
REFUSED = GenerationError(
    ErrorKind.UNAUTHORIZED,
    "A valid API key is required: send it as `Authorization: Bearer <key>` or `X-Api-Key`",
    "authorization",
)
_OPENAI = ("/v1/chat/completions", "/v1/completions", "/v1/models")
_LMI = ("/invocations", "/predictions/", "/endpoints/")
_TGI = frozenset({"/", "/generate", "/generate_stream", "/info"})


def refusal(path: str, error: GenerationError = REFUSED) -> tuple[int, bytes]:
    """The status and body the route at `path` answers an unauthorized request with."""
    if path.startswith(_OPENAI):
        return openai_answers.error_of(error)
    if path.startswith(_LMI):
        status = lmi.lmi_status(error.kind)
        return status, lmi.payload_error(named(error), status, dynamic=False)
    if path in _TGI:
        return tgi.error_body(error)
    if path == "/v1/generate":
        return status_of(error.kind), control.encode(control.error_message(error))
    return status_of(error.kind), rest_generate.encode_error(error)


def is_open(path: str, open_paths: frozenset[str]) -> bool:
    """`open_paths` entries are exact paths; one ending in `/*` opens what lies under it."""
    return path in open_paths or any(
        p.endswith("/*") and path.startswith(p[:-1]) for p in open_paths
    )


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, ring: KeyRing, open_paths: frozenset[str]) -> None:
        self.app = app
        self.ring = ring
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket") or not self.ring.enabled:
            await self.app(scope, receive, send)
            return
        if is_open(scope["path"], self.open_paths):
            await self.app(scope, receive, send)
            return
        name = self.ring.name_of(presented_key(scope))
        if name is None:
            if kind == "http":
                await _refuse_http(scope, receive, send)
            else:
                await _refuse_websocket(scope, receive, send)
            return
        scope.setdefault("state", {})["api_key"] = name
        offered = subprotocol_key(scope) if kind == "websocket" else None
        await self.app(scope, receive, _echoing(send, offered) if offered else send)


def _echoing(send: Send, key: str) -> Send:
    """Accept the `bearer.<key>` subprotocol the browser offered: it requires one chosen."""

    async def echo(message: Message) -> None:
        if message["type"] == "websocket.accept" and not message.get("subprotocol"):
            message = {**message, "subprotocol": SUBPROTOCOL_PREFIX + key}
        await send(message)

    return echo


async def _refuse_http(scope: Scope, receive: Receive, send: Send) -> None:
    status, body = refusal(scope["path"])
    headers = {"WWW-Authenticate": "Bearer"}
    response = Response(body, status, headers, media_type="application/json")
    await response(scope, receive, send)


async def _refuse_websocket(scope: Scope, receive: Receive, send: Send) -> None:
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    offered = subprotocol_key(scope)
    accept: Message = {"type": "websocket.accept"}
    if offered is not None:
        accept["subprotocol"] = SUBPROTOCOL_PREFIX + offered
    await send(accept)
    await send(
        {
            "type": "websocket.close",
            "code": CLOSE_POLICY_VIOLATION,
            "reason": "a valid API key is required",
        }
    )
