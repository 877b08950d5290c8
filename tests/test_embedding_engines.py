"""Embedding engines that die or are unregistered while they load, on real engines of the
tests' own: a killed embedding engine's requests are answered 503 at once in each family's
shape while it is rebuilt (its state in /health and the listings), and it serves again; a
model unregistered while its engine builds keeps its memory counted until the engine is gone,
and no engine outlives it."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import psutil
import pytest

from clients import wait_for, wait_ready, web
from serving import LoopThread, RunningServer, free_port, shared_loader

if TYPE_CHECKING:
    from gateway.engine.pooling_engine import PoolingEngine
    from gateway.engine.vllm_engine import VllmEngine

pytestmark = pytest.mark.own_engine  # embedding engines of its own, killed or left loading

ADMIN = "admin-key"
NAME = "all-MiniLM-L6-v2"
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN}"}


def _engine_cores() -> set[int]:
    """This process's vLLM engine-core processes (the servers run in it)."""
    found = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline()):
                found.add(child.pid)
        except psutil.Error:
            continue
    return found


@pytest.fixture
def dying(loop_thread: LoopThread, engine: VllmEngine) -> Iterator[tuple[RunningServer, Any]]:
    """A server on the session's chat engine with an embedding engine of its own: built anew
    at each call of its loader, a rebuild only once the returned event is set."""
    from conftest import embedding_settings

    from gateway.app import create_app
    from gateway.engine.pooling_engine import PoolingEngine

    rebuilds = asyncio.Event()
    calls = 0
    settings = embedding_settings(ADMIN_API_KEYS=ADMIN)

    async def load_embedding() -> PoolingEngine:
        nonlocal calls
        calls += 1
        if calls > 1:
            await rebuilds.wait()
        return await PoolingEngine.start(settings)

    app = create_app(
        settings, shared_loader(engine), owns_engine=False, load_embedding=load_embedding
    )
    running = RunningServer(loop_thread, app, settings, free_port())
    wait_ready(running.http)
    holder = _embedding_holder(running)
    wait_for(lambda: holder.ready)
    try:
        yield running, rebuilds
    finally:
        running.stop()
        loop_thread.run(holder.stop())


def _embedding_holder(server: RunningServer) -> Any:
    model = server.gateway.models.embedding()
    assert model is not None
    return model._holder


def test_a_killed_embedding_engine_is_answered_at_once_and_serves_again(
    dying: tuple[RunningServer, Any],
) -> None:
    from gateway.engine.vllm_seam import core_processes

    server, rebuilds = dying
    holder = _embedding_holder(server)
    engine: PoolingEngine = holder.engine
    assert not _not_niced(engine, 10)  # EMBEDDING_NICENESS, once built
    [core] = [p.pid for p in core_processes(engine.llm) if p.pid is not None]
    os.kill(core, signal.SIGKILL)
    wait_for(lambda: holder.restarts == 1)  # the holder asked its loader for an engine

    # Rebuilding (its loader held back): every family's 503 at once, not a wait for it
    refusals = [
        ("/v1/embeddings", {"model": NAME, "input": "hi"}),
        ("/embed", {"inputs": "hi"}),
        ("/v2/embed", {"model": NAME, "texts": ["hi"], "embedding_types": ["float"]}),
    ]
    answers = [web.post(server.http + path, json=body) for path, body in refusals]
    assert holder.status == "loading"  # every answer came while it rebuilt
    assert [a.status_code for a in answers] == [503, 503, 503], [a.text for a in answers]
    openai, tei, cohere = (a.json() for a in answers)
    assert openai["error"]["type"] and "rebuilt" in openai["error"]["message"], openai
    assert tei["error_type"] == "Unhealthy" and "rebuilt" in tei["error"], tei
    assert "rebuilt" in cohere["message"], cohere

    # Its state is visible: /health stays 200 (the chat model serves), each model's own
    health = web.get(server.http + "/health")
    assert health.status_code == 200, health.text
    states = {m["name"]: m for m in health.json()["models"]}
    assert states[NAME]["status"] == "loading" and "died" in states[NAME]["error"], states
    assert next(iter(states.values()))["status"] == "ready"  # the chat model, first
    listed = {m["id"]: m for m in web.get(server.http + "/v1/models").json()["data"]}
    assert listed[NAME]["status"] == "loading"
    djl = web.get(server.http + "/models", headers=ADMIN_HEADERS).json()["models"]
    assert {m["modelName"]: m["status"] for m in djl}[NAME] == "PENDING"

    server.loop.call(rebuilds.set)
    wait_for(lambda: holder.ready)
    again = web.post(server.http + "/v1/embeddings", json={"model": NAME, "input": "hi"})
    assert again.status_code == 200 and again.json()["data"][0]["embedding"], again.text
    assert {m["name"]: m["status"] for m in web.get(server.http + "/health").json()["models"]}[
        NAME
    ] == "ready"
    assert not _not_niced(holder.engine, 10)  # the rebuilt engine too, once built


def _not_niced(engine: PoolingEngine, niceness: int) -> list[tuple[str, int, int]]:
    """The threads of the engine's processes below `niceness`: (process, thread, niceness)."""
    from gateway.engine.vllm_seam import core_processes

    found = []
    for process in core_processes(engine.llm):
        assert process.pid is not None
        top = psutil.Process(process.pid)
        for member in [top, *top.children(recursive=True)]:
            for thread in member.threads():
                nice = os.getpriority(os.PRIO_PROCESS, thread.id)
                if nice < niceness:
                    found.append((member.name(), thread.id, nice))
    return found


def _call(server: RunningServer, method: str, path: str, **query: str) -> httpx.Response:
    return web.request(method, server.http + path, params=query, headers=ADMIN_HEADERS)


def test_a_model_unregistered_while_it_loads_is_counted_until_its_engine_is_gone(
    make_embedding_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """MODEL_LOAD_MEMORY_GIB admits one model loaded at run time (all-MiniLM-L6-v2's estimate
    is about 1.1 GiB): while the one unregistered as it loaded still builds, another is
    refused 507; once its engine is gone, none is left and the next one loads."""
    caplog.set_level(logging.WARNING)
    server: RunningServer = make_embedding_server(ADMIN_API_KEYS=ADMIN, MODEL_LOAD_MEMORY_GIB="1.5")
    registry = server.gateway.models
    cores = _engine_cores()
    scheduled = _call(
        server, "POST", "/models", url="default", model_name="leak1", synchronous="false"
    )
    assert scheduled.status_code == 202, scheduled.text
    gone = _call(server, "DELETE", "/models/leak1")
    assert gone.status_code == 200, gone.text
    # Answered while its engine still builds (a built one is stopped before the answer)
    assert server.loop.call(registry.winding_down) == 1
    refused = _call(server, "POST", "/models", url="default", model_name="leak2")
    assert refused.status_code == 507, refused.text
    assert "unregistered" in refused.json()["message"], refused.text
    assert [m["modelName"] for m in _call(server, "GET", "/models").json()["models"]] == [
        "SmolLM2-135M-Instruct",
        NAME,
    ]

    wait_for(lambda: server.loop.call(registry.winding_down) == 0)
    assert _engine_cores() <= cores  # its engine was built, then shut down: none is left
    loaded = _call(server, "POST", "/models", url="default", model_name="leak3")
    assert loaded.status_code == 200, loaded.text
    assert _call(server, "DELETE", "/models/leak3").status_code == 200
    assert server.loop.call(registry.winding_down) == 0  # a built engine: stopped at once
    wait_for(lambda: _engine_cores() <= cores)
    logged = [r.getMessage() + (r.exc_text or "") for r in caplog.records]
    assert not [m for m in logged if "InvalidStateError" in m], logged
