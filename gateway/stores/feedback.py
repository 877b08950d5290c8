"""Feedback on generations, kept durably in an embedded SQLite database, bounded in all:
once the file reaches FEEDBACK_MAX_DB_BYTES, new feedback is refused (each message's size and
each caller's rate are the edge's: gateway/edge/feedback_limits.py)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import msgspec

from gateway.config.settings import Settings
from protocols.errors import ErrorKind, GenerationError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS feedback (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    request_id TEXT NOT NULL,
    model TEXT NOT NULL,
    rating REAL NOT NULL,
    text TEXT,
    position INTEGER,
    created_at REAL NOT NULL,
    caller TEXT,
    caller_key_sha256 TEXT
)
"""
# Columns added since the first schema: a file written before them gets them, empty (NULL) in
# its earlier rows.
_ADDED_COLUMNS = {"caller": "TEXT", "caller_key_sha256": "TEXT"}
_COLUMNS = "request_id, model, rating, text, position, created_at, caller, caller_key_sha256"


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
    # Who sent it: the API key's name (its given name, or `key-` and 8 hex digits of its
    # SHA-256), or the client's address without keys; and the key's whole SHA-256. Never the
    # key. None in rows written before the gateway recorded it.
    caller: str | None = None
    caller_key_sha256: str | None = None


class FeedbackStoreFull(GenerationError):
    def __init__(self, max_bytes: int) -> None:
        super().__init__(
            ErrorKind.RATE_LIMITED,
            f"The feedback store is full: its file reached {max_bytes} bytes "
            "(FEEDBACK_MAX_DB_BYTES); this feedback was not recorded",
        )


class FeedbackStore:
    """One SQLite file; each write is its own committed transaction, off the event loop.
    `max_bytes` (0: none) bounds the file: checked inside the write's transaction, so writers
    (several gateways on one file too) pass it by one message at most."""

    def __init__(self, path: Path, max_bytes: int = 0) -> None:
        self.path = path
        self.max_bytes = max_bytes
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute(_SCHEMA)
            present = {row[1] for row in db.execute("PRAGMA table_info(feedback)")}
            for column, kind in _ADDED_COLUMNS.items():
                if column not in present:
                    db.execute(f"ALTER TABLE feedback ADD COLUMN {column} {kind}")

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=10)

    def add_now(self, record: FeedbackRecord) -> None:
        db = self._connect()
        try:
            with db:
                db.execute("BEGIN IMMEDIATE")  # the size check and the insert as one writer
                if self.max_bytes and _file_bytes(db) >= self.max_bytes:
                    raise FeedbackStoreFull(self.max_bytes)
                db.execute(
                    f"INSERT INTO feedback ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    msgspec.structs.astuple(record),
                )
        finally:
            db.close()

    async def add(self, record: FeedbackRecord) -> None:
        """Records it, or raises FeedbackStoreFull."""
        await asyncio.to_thread(self.add_now, record)

    def records(self) -> Iterator[FeedbackRecord]:
        with self._connect() as db:
            rows = db.execute(f"SELECT {_COLUMNS} FROM feedback ORDER BY id").fetchall()
        for row in rows:
            yield FeedbackRecord(*row)


def _file_bytes(db: sqlite3.Connection) -> int:
    (pages,) = db.execute("PRAGMA page_count").fetchone()
    (page_size,) = db.execute("PRAGMA page_size").fetchone()
    return int(pages) * int(page_size)
