"""The graceful end (SIGTERM): stop taking work, let what runs finish, end the rest cleanly.

`Drain.run`: health and ping answer 503 at once and new prompts are refused with the
protocol's "unavailable" error; running prompts get DRAIN_SECONDS to finish, then each ends
with one terminal error event; then every WebSocket sends what it still holds and closes with
1001 (going away). The server exits after `run` returns (gateway/server.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.edge.refusals import close_websocket
from gateway.engine_path.deadlines import Deadlines

log = logging.getLogger(__name__)
GOING_AWAY = 1001
Closer = Callable[[], Awaitable[None]]


class Drain:
    def __init__(self, deadlines: Deadlines, seconds: float) -> None:
        self.deadlines = deadlines
        self.seconds = seconds
        self._closers: set[Closer] = set()
        self._starters: list[Closer] = []

    @property
    def draining(self) -> bool:
        return self.deadlines.draining

    def on_drained(self, close: Closer) -> Callable[[], None]:
        """`close` runs at the drain's end, once every prompt ended: a WebSocket's (send what is
        queued, then close with 1001), the background responses' (their terminal events kept);
        the returned function forgets it, when the connection ends first."""
        self._closers.add(close)
        return lambda: self._closers.discard(close)

    def on_draining(self, start: Closer) -> None:
        """`start` runs as the drain begins (detached generations stop: no client can come
        back for them once new connections are refused)."""
        self._starters.append(start)

    async def run(self) -> None:
        self.deadlines.draining = True
        await asyncio.gather(*(start() for start in self._starters), return_exceptions=True)
        running = self.deadlines.active
        log.info("draining: %d prompts running, %g s to finish", running, self.seconds)
        try:
            await asyncio.wait_for(self.deadlines.idle(), self.seconds)
        except TimeoutError:
            log.warning("drain: %d prompts still running, ended", self.deadlines.active)
            self.deadlines.end_all()
            await self.deadlines.idle()
        closers = list(self._closers)
        await asyncio.gather(*(close() for close in closers), return_exceptions=True)
        log.info("drained: %d WebSockets closed", len(closers))


class DrainMiddleware:
    """While draining, a new WebSocket is closed at once with 1001."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and self.drain.draining:
            await close_websocket(scope, receive, send, GOING_AWAY, "the server is shutting down")
            return
        await self.app(scope, receive, send)
