"""uvicorn for the gateway, one place for the CLI and the test servers alike: its bounds, and
SIGTERM as a graceful drain (gateway/drain.py) rather than an end of every open stream."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
import sys
from types import FrameType
from typing import Any

import uvicorn
from starlette.applications import Starlette

from gateway.config.settings import Settings
from gateway.edge.connections import ConnectionBounds, bounded_http, raise_open_file_limit
from gateway.engine.grpc_client import use_poller_client


def uvicorn_config(
    app: Starlette, settings: Settings, host: str, port: int, **extra: Any
) -> uvicorn.Config:
    """Bounded connections: a request head must come whole within HEADER_TIMEOUT_SECONDS and
    64 KiB, a connection with no request under way closes after KEEP_ALIVE_SECONDS, and
    connections past MAX_CONNECTIONS (MAX_CONNECTIONS_PER_ADDRESS from one address) are
    refused as they open (gateway/edge/connections.py); WebSocket messages past
    MAX_WS_MESSAGE_BYTES close with 1009. A slow, idle or numerous client cannot hold the
    server."""
    bounds = ConnectionBounds(
        header_timeout_seconds=settings.header_timeout_seconds,
        max_connections=settings.max_connections,
        max_connections_per_address=settings.max_connections_per_address,
    )
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=bounded_http(bounds),
        ws_max_size=settings.max_ws_message_bytes,
        timeout_keep_alive=settings.keep_alive_seconds,
        **extra,
    )


class GatewayServer(uvicorn.Server):
    """The first SIGTERM drains, then exits (0); a second signal, or SIGINT, exits at once."""

    def __init__(self, config: uvicorn.Config, app: Starlette) -> None:
        super().__init__(config)
        self.app = app
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining: asyncio.Task[None] | None = None
        self.gave_up: str | None = None

    def give_up(self, reason: str) -> None:
        """The engine cannot be kept alive: exit, non-zero, for a supervisor to act."""
        self.gave_up = reason
        self.should_exit = True

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and self._draining is None and self._loop is not None:
            self._loop.call_soon_threadsafe(self.begin_drain)
            return
        super().handle_exit(sig, frame)

    def begin_drain(self) -> asyncio.Task[None]:
        """Drain, then exit; also what a test calls in place of a signal."""
        if self._draining is None:
            self._draining = asyncio.ensure_future(self._drain_then_exit())
        return self._draining

    async def _drain_then_exit(self) -> None:
        from gateway.state import gateway_of_app

        try:
            gateway = getattr(self.app.state, "gateway", None)
            if gateway is not None:  # the app has started
                await gateway_of_app(self.app).drain.run()
        finally:
            self.should_exit = True


def run_server(settings: Settings, host: str, port: int) -> int:
    if settings.engine_replicas:
        use_poller_client()  # before gateway.app imports Ray, and Ray gRPC
    from gateway.app import create_app

    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    server: GatewayServer | None = None

    def give_up(reason: str) -> None:
        if server is not None:
            server.give_up(reason)

    app = create_app(settings, on_give_up=give_up)
    if not (settings.api_keys or settings.api_keys_file) and not _is_loopback(host):
        logging.getLogger("gateway").warning(
            "no API keys (API_KEYS, API_KEYS_FILE): anyone who can reach %s:%d can use every "
            "route (docs/SECURITY.md)",
            host,
            port,
        )
    raise_open_file_limit(settings.max_connections)
    config = uvicorn_config(app, settings, host, port, log_level=settings.log_level)
    server = GatewayServer(config, app)
    server.run()
    if server.gave_up is not None:
        print(f"llm-gateway: {server.gave_up}", file=sys.stderr)
        return 1
    return 0


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
