"""Which engine replica a prompt should reach: its continuation key, where its blocks are.

`BatchRunner` sets `AFFINITY` in each prompt's own task to its continuation key, so the engine
replicas (gateway/engine/replicas.py) route every continuation of a key to the replica whose prefix
cache holds it. Unset (no key), any replica will do. The in-process engine ignores it.
"""

from __future__ import annotations

from contextvars import ContextVar

import msgspec

AFFINITY: ContextVar[str | None] = ContextVar("affinity", default=None)
_ENCODER = msgspec.json.Encoder()


def affinity_key(key: tuple[str, ...]) -> str:
    """The routing key of a continuation key (the owner, then the ordered request_ids)."""
    return _ENCODER.encode(list(key)).decode()
