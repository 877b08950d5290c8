"""GET `/health` and `/ping`'s answer: the engine's status, and why it is not ready; where
embedding models are served beside the chat model, each model's own."""

from __future__ import annotations

import msgspec


class ModelHealth(msgspec.Struct, omit_defaults=True):
    """One served model's engine: `status` ready, loading (also while it is rebuilt) or
    failed, and why it is not ready."""

    name: str
    task: str  # generate or embed
    status: str
    error: str | None = None


class Health(msgspec.Struct, omit_defaults=True):
    status: str  # ready, loading, failed, draining or degraded: the chat model's
    error: str | None = None
    models: list[ModelHealth] | None = None  # only with embedding models: every model's own


_ENCODER = msgspec.json.Encoder()


def encode_health(health: Health) -> bytes:
    return _ENCODER.encode(health)
