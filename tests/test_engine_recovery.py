"""The engine dies and the gateway heals itself: a real engine of the module's own, whose
engine-core process is killed with SIGKILL while streams of every kind run in it."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, NamedTuple

import pytest
from control_client import config, receive, until
from unending_streams import ESSAY, STREAMS, Event, Streams, tgi_stream

from clients import (
    CHAT,
    connect,
    events_of,
    greedy,
    payload,
    run_ws,
    wait_for,
    wait_ready,
    web,
)
from serving import LoopThread, RunningServer, gateway_settings, start_server

if TYPE_CHECKING:
    from gateway.engine.loader import EngineLoader
    from gateway.engine.vllm_engine import VllmEngine

pytestmark = pytest.mark.own_engine  # engines of its own, killed on purpose: make test-all


def own_engine_loader(rebuilds: asyncio.Event | None) -> EngineLoader:
    """Builds a new engine at every call: the server's first, then each rebuild once
    `rebuilds` is set (so a test sees the gateway while it rebuilds, however fast that is)."""
    calls = 0

    async def load() -> VllmEngine:
        from gateway.engine.default_model import prepare_default_model
        from gateway.engine.vllm_engine import VllmEngine

        nonlocal calls
        calls += 1
        if calls > 1 and rebuilds is not None:
            await rebuilds.wait()
        model = str(await asyncio.to_thread(prepare_default_model))
        return await VllmEngine.start(gateway_settings().engine, model)

    return load


@contextmanager
def own_engine_server(
    loop_thread: LoopThread, rebuilds: asyncio.Event | None = None, **env: str
) -> Iterator[RunningServer]:
    settings = gateway_settings(**env)
    loader = own_engine_loader(rebuilds)
    running = start_server(loop_thread, settings, loader, owns_engine=True)
    holder = running.gateway.service.holder
    # The restart limits as the settings say (create_app may not pass them to the holder).
    holder.max_restarts = settings.engine_max_restarts
    holder.restart_window_seconds = settings.engine_restart_window_seconds
    try:
        wait_ready(running.http)
        yield running
    finally:
        running.stop()


def engine_of(server: RunningServer) -> VllmEngine:
    from gateway.engine.vllm_engine import VllmEngine

    engine = server.gateway.service.holder.engine
    assert isinstance(engine, VllmEngine)
    return engine


def kill_engine_core(server: RunningServer) -> int:
    [pid] = server.loop.call(engine_of(server).core_pids)
    os.kill(pid, signal.SIGKILL)
    return pid


def health(server: RunningServer, path: str = "/health") -> tuple[int, Event]:
    response = web.get(server.http + path)
    return response.status_code, response.json()


# --- one unending stream per protocol: each calls `started` on its first token, and returns
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


class Healing(NamedTuple):
    server: RunningServer
    rebuilds: asyncio.Event  # set: the holder may build the next engine


@pytest.fixture(scope="module")
def healing(loop_thread: LoopThread) -> Iterator[Healing]:
    """One engine of the module's own, rebuilt once at most (ENGINE_MAX_RESTARTS=1): the first
    test's kill is healed, the next one's is past the limit. Each engine built costs a start,
    so the two tests share what one would build anyway."""
    rebuilds = asyncio.Event()
    with own_engine_server(loop_thread, rebuilds, ENGINE_MAX_RESTARTS="1") as server:
        yield Healing(server, rebuilds)


def test_a_killed_engine_fails_each_stream_once_and_the_gateway_serves_again(
    healing: Healing,
) -> None:
    server, rebuilds = healing
    holder = server.gateway.service.holder
    assert holder.restarts == 0  # the module's first kill
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
        waiting = pool.submit(web.post, server.http + "/generate", json=tgi_body)
        server.loop.call(rebuilds.set)
        # Read while it rebuilds, as a client must: a status arrives each second, and a client
        # that leaves them unread stops answering the server's keepalive pings.
        controlled = until(control_ws, "completion", "error")
        wait_ready(server.http)
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


def test_past_engine_max_restarts_the_holder_gives_up(healing: Healing) -> None:
    server, rebuilds = healing
    holder = server.gateway.service.holder
    reasons: list[str] = []
    holder.on_give_up = reasons.append
    server.loop.call(rebuilds.set)  # alone, this test's first kill is healed: the next is not
    while not holder.gave_up.is_set():
        restarts = holder.restarts
        with ThreadPoolExecutor(1) as pool:
            stream = Streams(pool, server, [tgi_stream])
            kill_engine_core(server)
            [error] = stream.results()
        assert "The engine stopped while generating" in error
        wait_for(lambda: holder.gave_up.is_set() or holder.restarts > restarts)  # noqa: B023
        if not holder.gave_up.is_set():
            wait_ready(server.http)

    [reason] = reasons
    assert "ENGINE_MAX_RESTARTS=1" in reason and "exited with code -9" in reason, reason
    assert holder.restarts == 1
    status, body = health(server)
    assert status == 503 and body == {"status": "failed", "error": reason}
    refused = web.post(server.http + "/generate", json={"inputs": ESSAY})
    assert refused.status_code == 503 and refused.json()["error_type"] == "unhealthy"
    assert reason in refused.json()["error"]
