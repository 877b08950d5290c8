"""GET `/health` and `/ping`'s answer: the engine's status, and why it is not ready."""

from __future__ import annotations

import msgspec


class Health(msgspec.Struct, omit_defaults=True):
    status: str  # ready, loading, failed, draining or degraded
    error: str | None = None


_ENCODER = msgspec.json.Encoder()


def encode_health(health: Health) -> bytes:
    return _ENCODER.encode(health)
