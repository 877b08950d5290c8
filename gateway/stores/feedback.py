"""Feedback on generations, kept durably in an embedded SQLite database."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec

from gateway.config.settings import Settings

_SCHEMA = """
CREATE TABLE IF NOT EXISTS feedback (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    request_id TEXT NOT NULL,
    model TEXT NOT NULL,
    rating REAL NOT NULL,
    text TEXT,
    position INTEGER,
    created_at REAL NOT NULL
)
"""


def feedback_path(settings: Settings) -> Path:
    if settings.feedback_db:
        return Path(settings.feedback_db)
    from gateway.config.cache import default_cache_dir

    return default_cache_dir() / "feedback.sqlite3"


class FeedbackRecord(msgspec.Struct):
    request_id: str
    model: str
    rating: float
    text: str | None
    position: int | None
    created_at: float  # Unix time, seconds


class FeedbackStore:
    """One SQLite file; each write is its own committed transaction, off the event loop."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=10)

    def add_now(self, record: FeedbackRecord) -> None:
        with self._connect() as db:
            db.execute(
                "INSERT INTO feedback (request_id, model, rating, text, position, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                msgspec.structs.astuple(record),
            )

    async def add(
        self, request_id: str, model: str, rating: float, text: str | None, position: int | None
    ) -> None:
        record = FeedbackRecord(request_id, model, rating, text, position, time.time())
        await asyncio.to_thread(self.add_now, record)

    def records(self) -> Iterator[FeedbackRecord]:
        with self._connect() as db:
            rows = db.execute(
                "SELECT request_id, model, rating, text, position, created_at"
                " FROM feedback ORDER BY id"
            ).fetchall()
        for row in rows:
            yield FeedbackRecord(*row)
