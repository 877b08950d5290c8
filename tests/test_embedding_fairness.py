"""One key floods the embedding model with the issue 56 probe's shapes (TEI's `/embed_all` of
32 inputs of 256 tokens, 43 MB answers, and OpenAI's `/v1/embeddings` of 2,048 inputs, from
four threads at once); another key's small embedding still goes into the engine at the first
free place, behind at most the two engine batches already there (docs/EMBEDDINGS.md). Checked
by the model's window counts (gateway/engine_path/input_window.py), not by clocks; the other
key's latency against its idle latency, in this one run, is reported beside them."""

from __future__ import annotations

import hashlib
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from clients import wait_for, web
from gateway.engine_path.input_window import Entry
from serving import RunningServer

pytestmark = pytest.mark.long  # a flood of some minutes on the session's engines

NAME = "all-MiniLM-L6-v2"
EMBED_ALL = {"inputs": ["word " * 250] * 32, "truncate": True}
MANY = {"model": NAME, "input": ["a sentence of a few words"] * 2048}
SMALL = {"model": NAME, "input": "hello world"}
BOB = hashlib.sha256(b"bob").hexdigest()  # a caller is its key's SHA-256


def test_a_flooding_key_keeps_another_keys_embedding_behind_two_batches_at_most(
    make_embedding_server: Callable[..., RunningServer], record_property: Any
) -> None:
    server = make_embedding_server(API_KEYS="alice,bob")
    model = server.gateway.models.embedding()
    assert model is not None
    window = model.window
    entries: list[Entry] = []
    server.loop.call(lambda: window.on_entry.append(entries.append))
    alice = web.client(headers={"Authorization": "Bearer alice"})
    bob = web.client(headers={"Authorization": "Bearer bob"})

    def probe() -> tuple[float, Entry]:
        since = len(entries)
        started = time.perf_counter()
        answer = bob.post(server.http + "/v1/embeddings", json=SMALL)
        seconds = time.perf_counter() - started
        assert answer.status_code == 200, answer.text
        [entry] = [e for e in entries[since:] if e.caller == BOB]
        return seconds, entry

    idle = [probe() for _ in range(3)]
    assert all(e.ahead == 0 for _, e in idle)

    stop = threading.Event()
    flooded = {"embed_all": 0, "embeddings": 0}

    def flood(path: str, body: dict[str, Any], kind: str) -> None:
        while not stop.is_set():
            answer = alice.post(server.http + path, json=body)
            assert answer.status_code == 200, answer.text[:300]
            flooded[kind] += 1

    with ThreadPoolExecutor(4) as pool:
        floods = [pool.submit(flood, "/embed_all", EMBED_ALL, "embed_all") for _ in range(2)]
        floods += [pool.submit(flood, "/v1/embeddings", MANY, "embeddings") for _ in range(2)]
        # The window full and alice's inputs queued behind it
        wait_for(lambda: window.waiting() >= 1000 or any(f.done() for f in floods))
        loaded = [probe() for _ in range(3)]
        stop.set()
        for done in floods:
            done.result()

    for _, entry in loaded:
        assert entry.waiting > 0, loaded  # alice's inputs were waiting as bob's went in...
        assert entry.passed == 0, loaded  # ...and none of them went in before it
        # behind at most the two batches already in the engine
        assert entry.ahead <= window.max_inputs and entry.ahead_tokens <= window.max_tokens
    idle_seconds = statistics.median(s for s, _ in idle)
    loaded_seconds = statistics.median(s for s, _ in loaded)
    ratio = loaded_seconds / idle_seconds
    record_property("bob_idle_seconds", idle_seconds)
    record_property("bob_flooded_seconds", loaded_seconds)
    record_property("ratio", ratio)
    print(  # the run's figures, for docs/EMBEDDINGS.md
        f"bob idle {idle_seconds:.3f} s, flooded {loaded_seconds:.3f} s ({ratio:.1f}x); "
        f"ahead {[e.ahead for _, e in loaded]} inputs, {[e.ahead_tokens for _, e in loaded]} "
        f"tokens; alice's answers during the flood {flooded}"
    )
