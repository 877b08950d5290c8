"""The stores the settings ask for: Redis with REDIS_URL, else this process's own.

The Redis client is the `redis` extra's (`pip install llm-gateway[redis]`): imported only when
REDIS_URL asks for it, so a gateway without the extra starts and serves from its own store."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.config.settings import Settings
from gateway.stores.continuation import HistoryStore, InProcessStore
from gateway.stores.event_log import EventLog, InProcessEventLog
from gateway.stores.pool import Bounds, Pool

if TYPE_CHECKING:
    from gateway.stores.redis_store import RedisStore


class RedisNotInstalled(RuntimeError):
    """REDIS_URL is set where the `redis` package is not installed."""


def _redis_store() -> type[RedisStore]:
    try:
        from gateway.stores.redis_store import RedisStore
    except ModuleNotFoundError as e:
        if e.name != "redis":
            raise
        raise RedisNotInstalled(
            "REDIS_URL is set but the redis package is not installed: "
            "pip install 'llm-gateway[redis]' (or unset REDIS_URL)"
        ) from e
    return RedisStore


def open_store(settings: Settings) -> HistoryStore:
    """Redis when REDIS_URL is set, else this process's bounded store."""
    if settings.redis_url:
        return _redis_store()(
            settings.redis_url,
            settings.continuation_idle_seconds,
            bounds=_bounds(settings),
        )
    return InProcessStore(Pool(_bounds(settings), settings.continuation_idle_seconds))


def _bounds(settings: Settings) -> Bounds:
    return Bounds(
        settings.continuation_max_entries,
        settings.continuation_max_bytes,
        settings.continuation_max_entries_per_key,
        settings.continuation_max_bytes_per_key,
    )


def open_event_log(settings: Settings, store: HistoryStore) -> EventLog:
    """Background responses' events beside the histories: in the same Redis, or in this
    process's pool with them."""
    if settings.redis_url:
        from gateway.stores.redis_events import RedisEventLog

        redis_store = _redis_store()
        if isinstance(store, redis_store):
            return RedisEventLog(store)
    if isinstance(store, InProcessStore):
        return InProcessEventLog(store.pool)
    return InProcessEventLog(Pool(_bounds(settings), settings.continuation_idle_seconds))
