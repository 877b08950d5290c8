"""Unending streams of every HTTP and WebSocket kind, in threads, each returning the message
of its one terminal error (asserting it is its protocol's only one, and not a cut stream):
what the engine's death (tests/test_engine_recovery.py) and the drain (tests/test_drain.py)
must end cleanly."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest

from clients import CHAT, UNENDING, connect, wait_for, web
from serving import RunningServer

ESSAY = CHAT.format("Write a very long essay about rivers.")
MODEL = "SmolLM2-135M-Instruct"
Started = Callable[[], None]
Event = dict[str, Any]


# --- its terminal error once the stream has ended, asserting it is its protocol's only one


def tgi_stream(server: RunningServer, started: Started) -> str:
    body = {"inputs": ESSAY, "parameters": {"max_new_tokens": UNENDING, "ignore_eos_token": True}}
    events: list[Event] = []
    with web.stream("POST", server.http + "/generate_stream", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line:
                events.append(json.loads(line.removeprefix("data: ")))
                if len(events) == 1:
                    started()
    *tokens, last = events
    assert tokens and all("error" not in e and e["generated_text"] is None for e in tokens)
    assert set(last) == {"error", "error_type"} and last["error_type"] == "unhealthy", last
    return str(last["error"])


def lmi_stream(server: RunningServer, started: Started) -> str:
    parameters = {"max_new_tokens": UNENDING, "ignore_eos_token": True}
    body = {"inputs": ESSAY, "parameters": parameters, "stream": True}
    lines: list[Event] = []
    with web.stream("POST", server.http + "/invocations", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line:
                lines.append(json.loads(line))
                if len(lines) == 1:
                    started()
    *tokens, last = lines
    assert tokens and all(t["token"]["id"] >= 0 and "details" not in t for t in tokens)
    assert last["token"]["id"] == -1 and last["details"]["finish_reason"] == "error", last
    return str(last["token"]["error_msg"])


def openai_stream(server: RunningServer, started: Started) -> str:
    client = openai.OpenAI(base_url=server.http + "/v1", api_key="unused", max_retries=0)
    chunks = 0
    with (
        pytest.raises(openai.APIError) as failed,
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Write a very long essay about rivers."}],
            max_tokens=UNENDING,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        ) as stream,
    ):
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                chunks += 1
                if chunks == 1:
                    started()
    # An error event in the stream, not a connection lost (APIConnectionError, a subclass).
    assert type(failed.value) is openai.APIError and chunks, failed.value
    assert isinstance(failed.value.body, dict) and failed.value.body["type"] == "server_error"
    return failed.value.message


def ws_events_stream(server: RunningServer, started: Started) -> str:
    parameters = {"max_new_tokens": UNENDING, "ignore_eos": True, "do_sample": False}
    event_id = f"essay-{uuid.uuid4()}"  # ids are request_ids: one at a time in the gateway
    start = {"type": "START", "id": event_id, "data": ESSAY, "parameters": parameters}
    events: list[Event] = []
    with connect(server.ws + "/ws/events") as ws:
        ws.send(json.dumps([start]))
        while not any(e["type"] in ("COMPLETE", "ERROR") for e in events):
            frame = json.loads(ws.recv())
            if not any(e["type"] == "PROGRESS" for e in events) and any(
                e["type"] == "PROGRESS" for e in frame
            ):
                started()
            events.extend(frame)
    *rest, last = events
    assert [e["type"] for e in rest[:1]] == ["START"]
    assert all(e["type"] == "PROGRESS" for e in rest[1:]) and len(rest) > 1, last
    assert last["type"] == "ERROR" and last["id"] == event_id, last
    return str(last["data"])


STREAMS: list[Callable[[RunningServer, Started], str]] = [
    tgi_stream,
    lmi_stream,
    openai_stream,
    ws_events_stream,
]


class Streams:
    """Unending streams in threads of `pool`, each running in the engine once this returns."""

    def __init__(
        self,
        pool: ThreadPoolExecutor,
        server: RunningServer,
        streams: list[Callable[[RunningServer, Started], str]],
    ) -> None:
        self._lock = threading.Lock()
        self._started = 0
        self._futures = [pool.submit(stream, server, self._start) for stream in streams]
        wait_for(lambda: self._started == len(streams) or any(f.done() for f in self._futures))
        for future in self._futures:
            if future.done():
                future.result()  # raises what ended a stream early
                raise AssertionError("a stream ended before the engine was killed")

    def _start(self) -> None:
        with self._lock:
            self._started += 1

    def results(self) -> list[str]:
        return [f.result() for f in self._futures]
