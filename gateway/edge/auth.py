"""The API-key check in front of every route, written once (the keys: gateway/edge/api_keys.py).

A request without a valid key never reaches its route: HTTP gets 401 in its protocol's own
error shape (OpenAI's error object, TGI's, LMI's, the control protocol's, the REST routes');
a WebSocket is accepted and closed at once with 1008, before any generation. A request that
passes becomes the `Caller` (gateway/edge/caller.py) of everything it does: its key, or its
connection when the gateway has no keys. A 429 of a rate-limited caller says when to retry.
"""

from __future__ import annotations

import math

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.config.settings import ConfigError
from gateway.edge.api_keys import SUBPROTOCOL_PREFIX, KeyRing, presented_key, subprotocol_key
from gateway.edge.caller import CALLER, Caller
from gateway.edge.limits import Limits
from gateway.edge.refusals import CLOSE_POLICY_VIOLATION, close_websocket, error_response
from protocols.errors import ErrorKind, GenerationError

REFUSED = GenerationError(
    ErrorKind.UNAUTHORIZED,
    "A valid API key is required: send it as `Authorization: Bearer <key>` or `X-Api-Key`",
    "authorization",
)


METRICS_PATH = "/metrics"


def open_paths_of(text: str, *, metrics_public: bool) -> frozenset[str]:
    """AUTH_OPEN_PATHS's paths, and `/metrics` when METRICS_PUBLIC is set: `/metrics` is
    opened by that setting alone, so an AUTH_OPEN_PATHS that names it (the default before
    METRICS_PUBLIC) stops start-up rather than leave it open unnoticed."""
    paths = frozenset(p.strip() for p in text.split(",") if p.strip())
    if METRICS_PATH in paths:
        raise ConfigError(
            f"AUTH_OPEN_PATHS: {METRICS_PATH} is opened by METRICS_PUBLIC=true alone; "
            f"remove it from AUTH_OPEN_PATHS"
        )
    return paths | {METRICS_PATH} if metrics_public else paths


def is_open(path: str, open_paths: frozenset[str]) -> bool:
    """`open_paths` entries are exact paths; one ending in `/*` opens what lies under it; a `+`
    segment stands for any one segment."""
    return path in open_paths or any(_matches(p, path) for p in open_paths if "*" in p or "+" in p)


def _matches(pattern: str, path: str) -> bool:
    wanted, given = pattern.split("/"), path.split("/")
    if wanted[-1] == "*":  # what lies under the rest: one more segment at least
        wanted = wanted[:-1]
        if len(given) <= len(wanted):
            return False
        given = given[: len(wanted)]
    return len(wanted) == len(given) and all(
        w in ("+", g) for w, g in zip(wanted, given, strict=True)
    )


def connection_of(scope: Scope) -> str:
    host, port = scope.get("client") or ("", 0)
    return f"{host}:{port}"


class ApiKeyMiddleware:
    def __init__(
        self, app: ASGIApp, ring: KeyRing, open_paths: frozenset[str], limits: Limits
    ) -> None:
        self.app = app
        self.ring = ring
        self.open_paths = open_paths
        self.limits = limits  # with no keys, every connection's

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if not self.ring.enabled or is_open(scope["path"], self.open_paths):
            caller = Caller(connection_of(scope), "", self.limits)
        else:
            entry = self.ring.entry_of(presented_key(scope))
            if entry is None:
                if kind == "http":
                    await _refuse_http(scope, receive, send)
                else:
                    await _refuse_websocket(scope, receive, send)
                return
            scope.setdefault("state", {})["api_key"] = entry.name
            caller = Caller(entry.owner, entry.owner, entry.limits, name=entry.name)
            offered = subprotocol_key(scope) if kind == "websocket" else None
            if offered:
                send = _echoing(send, offered)
        token = CALLER.set(caller)
        try:
            await self.app(scope, receive, _retry_after(send, caller) if kind == "http" else send)
        finally:
            CALLER.reset(token)


_RETRYABLE = frozenset({429, 503, 529})  # 529: Anthropic's overloaded_error


def _retry_after(send: Send, caller: Caller) -> Send:
    """A 429 says when to retry: when the caller's limit allows again, else in a second; a 503
    (Anthropic's 529) in a second: the engine restarting, a constraint's compile that gave no
    verdict (gateway/engine/constraint_check.py)."""

    async def with_header(message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] in _RETRYABLE:
            headers = list(message.get("headers", ()))
            if all(name.lower() != b"retry-after" for name, _ in headers):
                wait = caller.retry_after if message["status"] == 429 else None
                seconds = str(max(1, math.ceil(wait or 1.0)))
                headers.append((b"retry-after", seconds.encode()))
                message = {**message, "headers": headers}
        await send(message)

    return with_header


def _echoing(send: Send, key: str) -> Send:
    """Accept the `bearer.<key>` subprotocol the browser offered: it requires one chosen."""

    async def echo(message: Message) -> None:
        if message["type"] == "websocket.accept" and not message.get("subprotocol"):
            message = {**message, "subprotocol": SUBPROTOCOL_PREFIX + key}
        await send(message)

    return echo


async def _refuse_http(scope: Scope, receive: Receive, send: Send) -> None:
    response = error_response(scope["path"], REFUSED, headers={"WWW-Authenticate": "Bearer"})
    await response(scope, receive, send)


async def _refuse_websocket(scope: Scope, receive: Receive, send: Send) -> None:
    offered = subprotocol_key(scope)
    echoed = SUBPROTOCOL_PREFIX + offered if offered is not None else None
    reason = "a valid API key is required"
    await close_websocket(scope, receive, send, CLOSE_POLICY_VIOLATION, reason, echoed)
