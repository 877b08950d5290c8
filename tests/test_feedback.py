"""Issue 31, feedback bounded and attributed: a message's `text` (FEEDBACK_MAX_TEXT_BYTES), a
key's messages a minute (FEEDBACK_PER_MINUTE), the database file (FEEDBACK_MAX_DB_BYTES), and
each row records the key it came from, never the key itself (docs/SECURITY.md, docs/CONTROL.md).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from control_client import Message, config, receive, until
from websockets.sync.connection import Connection

from clients import CHAT, connect
from gateway.edge.feedback_limits import FeedbackLimits
from gateway.edge.limits import RateLimited
from gateway.stores.feedback import FeedbackRecord, FeedbackStore, FeedbackStoreFull
from protocols.errors import ErrorKind, GenerationError
from serving import RunningServer

PROMPT = CHAT.format("Hi")
# The table as the gateway wrote it before it recorded callers.
FIRST_SCHEMA = """
CREATE TABLE feedback (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    request_id TEXT NOT NULL,
    model TEXT NOT NULL,
    rating REAL NOT NULL,
    text TEXT,
    position INTEGER,
    created_at REAL NOT NULL
)
"""


def record(text: str | None = None, caller: str | None = "alice") -> FeedbackRecord:
    return FeedbackRecord("gen_1", "m", 1.0, text, None, 0.0, caller, "ab" * 32)


def test_a_file_written_before_callers_were_recorded_gets_the_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute(FIRST_SCHEMA)
        db.execute(
            "INSERT INTO feedback (request_id, model, rating, text, position, created_at)"
            " VALUES ('gen_0', 'm', -1, 'old', 3, 1.5)"
        )
    store = FeedbackStore(path)
    store.add_now(record("new"))
    old, new = store.records()
    assert old == FeedbackRecord("gen_0", "m", -1.0, "old", 3, 1.5, None, None)
    assert new == record("new")
    assert len(list(FeedbackStore(path).records())) == 2  # opening it again changes nothing


def test_a_full_store_refuses_new_feedback(tmp_path: Path) -> None:
    path = tmp_path / "full.sqlite3"
    empty = FeedbackStore(path)
    bound = path.stat().st_size + 8192
    store = FeedbackStore(path, max_bytes=bound)
    text = "x" * 3000  # about a page of the file each
    recorded = 0
    with pytest.raises(FeedbackStoreFull) as full:
        while True:
            store.add_now(record(text))
            recorded += 1
    assert recorded >= 2 and "FEEDBACK_MAX_DB_BYTES" in full.value.message
    assert path.stat().st_size <= bound + len(text) + 4096  # one message past it, at most
    assert len(list(empty.records())) == recorded
    FeedbackStore(path, max_bytes=2 * bound).add_now(record(text))  # a larger bound takes more


def test_feedback_text_is_bounded_in_bytes_and_a_callers_rate_in_messages() -> None:
    limits = FeedbackLimits(max_text_bytes=8, per_minute=2)
    with pytest.raises(GenerationError) as oversize:
        limits.admit("alice", "é" * 5)  # 5 characters, 10 bytes
    assert oversize.value.kind is ErrorKind.INVALID_REQUEST
    assert oversize.value.field == "$.text" and "FEEDBACK_MAX_TEXT_BYTES" in oversize.value.message
    limits.admit("alice", "é" * 4)
    limits.admit("alice", None)
    with pytest.raises(RateLimited) as rated:
        limits.admit("alice", None)
    assert "FEEDBACK_PER_MINUTE" in rated.value.message and 0 < rated.value.retry_after <= 60
    limits.admit("bob", None)  # another caller's minute is its own
    unlimited = FeedbackLimits(max_text_bytes=8, per_minute=0)
    for _ in range(100):
        unlimited.admit("alice", "ok")


def feedback(rating: float = 1, **fields: Any) -> str:
    return json.dumps({"type": "feedback", "rating": rating, **fields})


@contextmanager
def generated(server: RunningServer, key: str | None = None) -> Iterator[Connection]:
    """A control connection (with the key), after one generation: feedback needs one."""
    with connect(server.ws + "/generate", subprotocols=[f"bearer.{key}"] if key else None) as ws:
        generate(ws)
        yield ws


def generate(ws: Connection) -> None:
    ws.send(config(PROMPT, max_tokens=1, temperature=0))
    until(ws, "completion")


def answer_to(ws: Connection, message: str) -> Message:
    ws.send(message)
    return receive(ws)


def test_feedback_is_bounded_and_each_row_names_its_key(
    make_server: Callable[..., RunningServer], tmp_path: Path
) -> None:
    db = tmp_path / "feedback.sqlite3"
    server = make_server(
        API_KEYS="sk-alice-secret:alice,sk-other-secret",
        FEEDBACK_DB=str(db),
        FEEDBACK_MAX_TEXT_BYTES="1024",
        FEEDBACK_PER_MINUTE="2",
    )
    with generated(server, "sk-alice-secret") as ws:
        oversize = answer_to(ws, feedback(text="x" * 3 * 1024 * 1024))
        assert oversize["type"] == "error" and oversize["error"] == "invalid_request"
        assert oversize["field"] == "$.text" and "FEEDBACK_MAX_TEXT_BYTES" in oversize["message"]
        assert oversize["recoverable"] is True
        assert answer_to(ws, feedback(text="good"))["operation"] == "feedback_recorded"
        assert answer_to(ws, feedback(-1))["operation"] == "feedback_recorded"
        rated = answer_to(ws, feedback(1))
        assert rated["type"] == "error" and rated["error"] == "rate_limited"
        assert "FEEDBACK_PER_MINUTE" in rated["message"]
    with generated(server, "sk-other-secret") as ws:  # its own minute
        assert answer_to(ws, feedback(0.5))["operation"] == "feedback_recorded"
    alice = hashlib.sha256(b"sk-alice-secret").hexdigest()
    other = hashlib.sha256(b"sk-other-secret").hexdigest()
    rows = [(r.caller, r.caller_key_sha256, r.text) for r in FeedbackStore(db).records()]
    assert rows == [
        ("alice", alice, "good"),
        ("alice", alice, None),
        (f"key-{other[:8]}", other, None),
    ]
    assert b"secret" not in db.read_bytes()  # never a key


def test_a_full_feedback_store_answers_storage_full(
    make_server: Callable[..., RunningServer], tmp_path: Path
) -> None:
    db = tmp_path / "feedback.sqlite3"
    FeedbackStore(db)
    bound = db.stat().st_size + 8192
    server = make_server(
        FEEDBACK_DB=str(db), FEEDBACK_MAX_DB_BYTES=str(bound), FEEDBACK_PER_MINUTE="0"
    )
    text = "x" * 3000
    with generated(server) as ws:
        while (answer := answer_to(ws, feedback(text=text)))["type"] == "status":
            assert answer["operation"] == "feedback_recorded"
        assert answer["type"] == "error" and answer["error"] == "storage_full"
        assert "FEEDBACK_MAX_DB_BYTES" in answer["message"]
        assert answer["recoverable"] is True and answer["recovery_action"] == "none"
        generate(ws)  # the connection goes on
    rows = list(FeedbackStore(db).records())
    assert rows and all(r.caller and r.caller_key_sha256 is None for r in rows)  # no keys
    assert db.stat().st_size <= bound + len(text) + 4096
