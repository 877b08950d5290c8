"""The engine dies and the gateway heals itself: a real engine of the test's own, whose
engine-core process is killed with SIGKILL while streams of every kind run in it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
from control_client import config, receive, until

from clients import (
    CHAT,
    UNENDING,
    connect,
    events_of,
    greedy,
    payload,
    run_ws,
    wait_for,
    wait_ready,
)
from serving import LoopThread, RunningServer, gateway_settings, start_server

if TYPE_CHECKING:
    from gateway.app import EngineLoader
    from gateway.engine import Engine

ESSAY = CHAT.format("Write a very long essay about rivers.")
MODEL = "SmolLM2-135M-Instruct"
Started = Callable[[], None]
Event = dict[str, Any]


def own_engine_loader(rebuilds: asyncio.Event | None) -> EngineLoader:
    """Builds a new engine at every call: the server's first, then each rebuild once
    `rebuilds` is set (so a test sees the gateway while it rebuilds, however fast that is)."""
    calls = 0

    async def load() -> Engine:
        from gateway.default_model import prepare_default_model
        from gateway.engine import Engine

        nonlocal calls
        calls += 1
        if calls > 1 and rebuilds is not None:
            await rebuilds.wait()
        model = str(await asyncio.to_thread(prepare_default_model))
        return await Engine.start(gateway_settings().engine, model)

    return load


@contextmanager
def own_engine_server(
    loop_thread: LoopThread, rebuilds: asyncio.Event | None = None, **env: str
) -> Iterator[RunningServer]:
    settings = gateway_settings(**env)
    loader = own_engine_loader(rebuilds)
    running = start_server(loop_thread, settings, loader, owns_engine=True)
    holder = running.gateway.holder
    # The restart limits as the settings say (create_app may not pass them to the holder).
    holder.max_restarts = settings.engine_max_restarts
    holder.restart_window_seconds = settings.engine_restart_window_seconds
    try:
        wait_ready(running.http)
        yield running
    finally:
        running.stop()


def engine_of(server: RunningServer) -> Engine:
    engine = server.gateway.holder.engine
    assert engine is not None
    return engine


def kill_engine_core(server: RunningServer) -> int:
    [pid] = server.loop.call(engine_of(server).core_pids)
    os.kill(pid, signal.SIGKILL)
    return pid


def health(server: RunningServer, path: str = "/health") -> tuple[int, Event]:
    response = httpx.get(server.http + path, timeout=None)
    return response.status_code, response.json()


# --- one unending stream per protocol: each calls `started` on its first token, and returns
# --- its terminal error once the stream has ended, asserting it is its protocol's only one


def tgi_stream(server: RunningServer, started: Started) -> str:
    body = {"inputs": ESSAY, "parameters": {"max_new_tokens": UNENDING, "ignore_eos_token": True}}
    events: list[Event] = []
    with httpx.stream("POST", server.http + "/generate_stream", json=body, timeout=None) as r:
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
    with httpx.stream("POST", server.http + "/invocations", json=body, timeout=None) as r:
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


def continue_key(server: RunningServer, key: str, prompt: str) -> Event:
    """The key's sequence 8 greedy tokens further: its COMPLETE event, and its INITIALIZED text
    (the sequence it continued) under "from"."""
    body = payload(
        (key, prompt), only_new_tokens=False, generation_config=greedy(8, ignore_eos=True)
    )
    events = events_of(run_ws(server.ws, body, {key}), key)
    [initialized] = [e for e in events if e["type"] == "INITIALIZED"]
    complete = events[-1]
    assert complete["type"] == "COMPLETE", events
    return {**complete, "from": initialized["text"]}


def test_a_killed_engine_fails_each_stream_once_and_the_gateway_serves_again(
    loop_thread: LoopThread,
) -> None:
    rebuilds = asyncio.Event()
    with own_engine_server(loop_thread, rebuilds) as server:
        holder = server.gateway.holder
        prompt = CHAT.format("Tell me about lighthouses.")
        key = f"before-{uuid.uuid4()}"
        first = continue_key(server, key, prompt)

        with ThreadPoolExecutor(16) as pool:
            streams = Streams(pool, server, [STREAMS[i % 4] for i in range(16)])
            killed = kill_engine_core(server)
            errors = streams.results()

        assert all("The engine stopped while generating" in e for e in errors), errors
        wait_for(lambda: holder.restarts == 1)  # the holder asked its loader for an engine
        # Rebuilding: /health and /ping answer 503, requests wait as they do at start-up.
        status, body = health(server)
        assert status == 503 and body["status"] == "loading" and "died" in body["error"], body
        assert health(server, "/ping")[0] == 503
        tgi_body = {"inputs": prompt, "parameters": {"max_new_tokens": 4}}
        with connect(server.ws + "/generate") as control_ws, ThreadPoolExecutor(1) as pool:
            loading = receive(control_ws)
            assert loading["type"] == "status" and loading["operation"] == "model_loading"
            control_ws.send(config(prompt, max_tokens=4, temperature=0))
            waiting = pool.submit(
                httpx.post, server.http + "/generate", json=tgi_body, timeout=None
            )
            server.loop.call(rebuilds.set)
            wait_ready(server.http)
            controlled = until(control_ws, "completion", "error")
            answer = waiting.result()
        assert controlled[-1]["type"] == "completion", controlled
        assert {m["type"] for m in controlled} >= {"init", "token"}
        assert answer.status_code == 200 and answer.json()["generated_text"], answer.text
        assert health(server, "/ping") == (200, {"status": "ready"})
        assert killed not in server.loop.call(engine_of(server).core_pids)

        # The history kept before the kill continues on the new engine as it would have.
        continued = continue_key(server, key, "ignored")
        assert continued["from"] == first["text"]
        fresh_key = f"after-{uuid.uuid4()}"
        again = continue_key(server, fresh_key, prompt)
        assert again["text"] == first["text"]
        assert continue_key(server, fresh_key, "ignored")["text"] == continued["text"]
        assert holder.restarts == 1 and not holder.gave_up.is_set()


def test_past_engine_max_restarts_the_holder_gives_up(loop_thread: LoopThread) -> None:
    with own_engine_server(loop_thread, ENGINE_MAX_RESTARTS="0") as server:
        holder = server.gateway.holder
        reasons: list[str] = []
        holder.on_give_up = reasons.append

        with ThreadPoolExecutor(1) as pool:
            stream = Streams(pool, server, [tgi_stream])
            kill_engine_core(server)
            [error] = stream.results()
        assert "The engine stopped while generating" in error

        wait_for(holder.gave_up.is_set)
        [reason] = reasons
        assert "ENGINE_MAX_RESTARTS=0" in reason and "exited with code -9" in reason, reason
        assert holder.restarts == 0
        status, body = health(server)
        assert status == 503 and body == {"status": "failed", "error": reason}
        refused = httpx.post(server.http + "/generate", json={"inputs": ESSAY}, timeout=None)
        assert refused.status_code == 503 and refused.json()["error_type"] == "unhealthy"
        assert reason in refused.json()["error"]
