"""ALLOWED_ORIGINS: which web pages may call the gateway, from a browser, on any route.

A request with no `Origin` (curl, SDKs, servers) and one from a page on this machine's
loopback names (the gateway's own, opened locally or through a port map) are always let
through. The request's `Host` is never trusted for that: a page
of a name the attacker points at this address (DNS rebinding) sends its own name as the Host.
A page of another origin, the gateway's own opened by any other name included, is let
through when ALLOWED_ORIGINS names it (or is `*`): its HTTP calls get CORS headers, and their
preflight (`OPTIONS`) is answered here.
Any other page is refused: its WebSocket is closed with 1008, its HTTP call gets 403 in the
protocol's error shape, before any route runs (a "simple" cross-origin POST needs no
preflight, so refusing only the preflight would let it generate).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.edge.refusals import CLOSE_POLICY_VIOLATION, close_websocket, error_response
from protocols.errors import ErrorKind, GenerationError

FORBIDDEN = 403
_METHODS = "GET, POST, OPTIONS"
_HEADERS = "authorization, content-type, accept, x-api-key"
_PREFLIGHT_CACHE_SECONDS = "600"


def parse_origins(text: str) -> frozenset[str]:
    return frozenset(o.strip().rstrip("/").lower() for o in text.split(",") if o.strip())


_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def is_own_page(origin: str) -> bool:
    """A page on this machine's loopback names (http://localhost:PORT, 127.0.0.1, [::1]), any
    port: the gateway's own opened locally, through a port map (`docker run -p`) or a tunnel
    (`ssh -L`, `kubectl port-forward`). A rebound page keeps its own name in its Origin, so only
    a page this machine serves can send one of these; any other is known by ALLOWED_ORIGINS."""
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.hostname in _LOOPBACK_NAMES


class OriginMiddleware:
    def __init__(self, app: ASGIApp, allowed: frozenset[str]) -> None:
        self.app = app
        self.allowed = allowed

    def _allows(self, origin: str) -> bool:
        return "*" in self.allowed or origin.lower() in self.allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is None or is_own_page(origin):
            await self.app(scope, receive, send)
            return
        allowed = self._allows(origin)
        if scope["type"] == "websocket":
            if allowed:
                await self.app(scope, receive, send)
            else:
                reason = "this page's origin may not use the gateway (ALLOWED_ORIGINS)"
                await close_websocket(scope, receive, send, CLOSE_POLICY_VIOLATION, reason)
            return
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            await _preflight(origin, allowed, headers)(scope, receive, send)
        elif allowed:
            await self.app(scope, receive, _with_cors(send, origin))
        else:
            error = GenerationError(
                ErrorKind.UNAUTHORIZED,
                f"Pages from {origin} may not call this server (ALLOWED_ORIGINS)",
                "origin",
            )
            await error_response(scope["path"], error, FORBIDDEN)(scope, receive, send)


def _preflight(origin: str, allowed: bool, headers: Headers) -> Response:
    if not allowed:
        return Response(status_code=FORBIDDEN)
    asked = headers.get("access-control-request-headers")
    return Response(
        status_code=204,
        headers={
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Allow-Methods": _METHODS,
            "Access-Control-Allow-Headers": asked or _HEADERS,
            "Access-Control-Max-Age": _PREFLIGHT_CACHE_SECONDS,
            "Vary": "Origin",
        },
    )


def _with_cors(send: Send, origin: str) -> Send:
    async def cors(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [
                *message.get("headers", ()),
                (b"access-control-allow-origin", origin.encode("latin-1")),
                (b"access-control-expose-headers", b"retry-after"),
                (b"vary", b"Origin"),
            ]
            message = {**message, "headers": headers}
        await send(message)

    return cors
