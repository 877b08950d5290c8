"""The stores the settings ask for: Redis with REDIS_URL, else this process's own."""

from __future__ import annotations

from gateway.config.settings import Settings
from gateway.stores.continuation import HistoryStore, InProcessStore
from gateway.stores.event_log import EventLog, InProcessEventLog
from gateway.stores.pool import Bounds, Pool
from gateway.stores.redis_events import RedisEventLog
from gateway.stores.redis_store import RedisStore


def open_store(settings: Settings) -> HistoryStore:
    """Redis when REDIS_URL is set, else this process's bounded store."""
    if settings.redis_url:
        return RedisStore(
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
    if isinstance(store, RedisStore):
        return RedisEventLog(store)
    if isinstance(store, InProcessStore):
        return InProcessEventLog(store.pool)
    return InProcessEventLog(Pool(_bounds(settings), settings.continuation_idle_seconds))
