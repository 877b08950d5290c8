"""uvicorn's settings for the gateway, one place for the CLI and the test servers alike."""

from __future__ import annotations

from typing import Any

import uvicorn
from starlette.applications import Starlette

from gateway.config import Settings


def uvicorn_config(
    app: Starlette, settings: Settings, host: str, port: int, **extra: Any
) -> uvicorn.Config:
    """Bounded connections: WebSocket messages past MAX_WS_MESSAGE_BYTES close with 1009, idle
    keep-alive connections close after KEEP_ALIVE_SECONDS, and an unfinished request head is
    at most 64 KiB (h11's own bound), so a slow or huge client cannot hold a worker."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        ws_max_size=settings.max_ws_message_bytes,
        timeout_keep_alive=settings.keep_alive_seconds,
        h11_max_incomplete_event_size=64 * 1024,
        **extra,
    )
