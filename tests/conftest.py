"""Session fixtures: one eager engine on the default model, and a server on it.

Importing this file imports no vLLM: the engine and the app are imported inside the fixtures,
so the tests that need neither (`make test-fast`, `pytest -m "not engine"`) run where vLLM is
not installed. Every test that uses the engine, directly or through a server, is marked
`engine` here, from the fixtures it asks for.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from ray_cluster import ray_address  # noqa: F401  # the session's Ray cluster: a fixture

from clients import wait_for, wait_ready
from gateway.engine.grpc_client import use_poller_client
from serving import (
    LoopThread,
    RunningServer,
    free_port,
    gateway_settings,
    shared_loader,
    start_server,
    vllm_openai_server,
)

if TYPE_CHECKING:
    from gateway.config.settings import Settings
    from gateway.engine.pooling_engine import PoolingEngine
    from gateway.engine.vllm_engine import VllmEngine

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
# litellm fetches its model cost map from the internet when first imported (three tries, the
# last seconds apart, where the network reaches only package registries): its own copy instead.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# Ray reads these when first imported, and vLLM imports Ray (when installed) with the first
# engine: set here, before any test module or fixture imports vLLM. One machine, loopback
# only (else Ray dials the machine's interface address), and no token from ~/.ray.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_AUTH_MODE"] = "disabled"
use_poller_client()  # gRPC's client as `llm-gateway serve` sets it with replicas: before Ray

ENGINE_FIXTURES = {
    "engine",
    "loop_thread",
    "embedding_engine",
}  # every server fixture depends on both
# Servers and clusters beside the session's engine: a test using one is `make test-all`'s.
OWN_ENGINE_FIXTURES = {"vllm_server", "ray_address"}


# The embedding engine is built beside the chat engine, not after it, when the session will
# use both: two engine starts overlap (imports, a process each, their waits) where one after
# the other they add up (issue 55: the suite's time on the slowest CPU).
_EMBEDDING_WANTED: list[bool] = [False]
_EARLY_EMBEDDING: list[concurrent.futures.Future[PoolingEngine]] = []


@pytest.hookimpl(trylast=True)  # once `-m` and `-k` have chosen what runs
def pytest_collection_finish(session: pytest.Session) -> None:
    _EMBEDDING_WANTED[0] = any(
        "embedding_engine" in getattr(item, "fixturenames", ()) for item in session.items
    )


@pytest.hookimpl(tryfirst=True)  # before `-m` selects on the marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if ENGINE_FIXTURES & fixtures:
            item.add_marker(pytest.mark.engine)
        if OWN_ENGINE_FIXTURES & fixtures:
            item.add_marker(pytest.mark.own_engine)


@pytest.fixture(scope="session")
def loop_thread() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.stop()


@pytest.fixture(scope="session")
def engine(loop_thread: LoopThread) -> Iterator[VllmEngine]:
    from gateway.engine.default_model import prepare_default_model
    from gateway.engine.vllm_engine import VllmEngine

    model = str(prepare_default_model())
    if _EMBEDDING_WANTED[0]:
        from gateway.engine.pooling_engine import PoolingEngine

        early = PoolingEngine.start(embedding_settings())
        _EARLY_EMBEDDING.append(asyncio.run_coroutine_threadsafe(early, loop_thread.loop))
    built = loop_thread.run(VllmEngine.start(gateway_settings().engine, model))
    yield built
    loop_thread.call(built.shutdown)
    for unclaimed in _EARLY_EMBEDDING:  # built, and no test took it
        loop_thread.call(unclaimed.result().shutdown)


@pytest.fixture(scope="session")
def server(loop_thread: LoopThread, engine: VllmEngine) -> Iterator[RunningServer]:
    running = start_server(loop_thread, gateway_settings(), shared_loader(engine))
    wait_ready(running.http)
    yield running
    running.stop()


def embedding_settings(**env: str) -> Settings:
    """The test settings with the shipped embedding model, in float32: its vectors then equal
    sentence-transformers' own."""
    return gateway_settings(EMBEDDING_MODEL="default", EMBEDDING_DTYPE="float32", **env)


@pytest.fixture(scope="session")
def embedding_engine(loop_thread: LoopThread) -> Iterator[PoolingEngine]:
    """The shipped embedding model's pooling engine: one for the session."""
    from gateway.engine.pooling_engine import PoolingEngine

    if _EARLY_EMBEDDING:
        built = _EARLY_EMBEDDING.pop().result()
    else:
        built = loop_thread.run(PoolingEngine.start(embedding_settings()))
    yield built
    loop_thread.call(built.shutdown)


def _embedding_server(
    loop_thread: LoopThread, engine: VllmEngine, embedding_engine: PoolingEngine, **env: str
) -> RunningServer:
    from gateway.app import create_app

    async def load_embedding() -> PoolingEngine:
        return embedding_engine

    settings = embedding_settings(**env)
    app = create_app(
        settings, shared_loader(engine), owns_engine=False, load_embedding=load_embedding
    )
    running = RunningServer(loop_thread, app, settings, free_port())
    wait_ready(running.http)
    return running


@pytest.fixture(scope="session")
def embedding_server(
    loop_thread: LoopThread, engine: VllmEngine, embedding_engine: PoolingEngine
) -> Iterator[RunningServer]:
    """A server with the chat model and the embedding model, on the session's two engines."""
    running = _embedding_server(loop_thread, engine, embedding_engine)
    yield running
    running.stop()


@pytest.fixture
def make_embedding_server(
    loop_thread: LoopThread, engine: VllmEngine, embedding_engine: PoolingEngine
) -> Iterator[Callable[..., RunningServer]]:
    """Another server on the session's two engines, with its own settings (keys, limits...)."""
    started: list[RunningServer] = []

    def make(**env: str) -> RunningServer:
        running = _embedding_server(loop_thread, engine, embedding_engine, **env)
        started.append(running)
        return running

    yield make
    for running in started:
        running.stop()


@pytest.fixture(scope="session")
def adapter_dir() -> Path:
    """The test LoRA adapter (it answers gateway_bench.adapter_recipe.PHRASE), made once."""
    from gateway.engine.default_model import prepare_default_model
    from gateway_bench.adapter_recipe import cached_adapter

    return cached_adapter(prepare_default_model())


@pytest.fixture(scope="session")
def vllm_server(loop_thread: LoopThread) -> Iterator[str]:
    """vLLM's own OpenAI server at the test engine's settings (its URL): one for the session."""
    with vllm_openai_server(loop_thread) as url:
        yield url


@pytest.fixture
def make_server(
    loop_thread: LoopThread, engine: VllmEngine
) -> Iterator[Callable[..., RunningServer]]:
    """Another server on the shared engine, with its own settings (admission, store...)."""
    started: list[RunningServer] = []

    def make(send_buffer_bytes: int | None = None, **env: str) -> RunningServer:
        """`send_buffer_bytes`: behind a slow network's stand-in (serving.start_server)."""
        settings = gateway_settings(**env)
        running = start_server(
            loop_thread, settings, shared_loader(engine), False, send_buffer_bytes
        )
        started.append(running)
        wait_ready(running.http)
        return running

    yield make
    for running in started:
        running.stop()


@pytest.fixture
def engine_requests(loop_thread: LoopThread, engine: VllmEngine) -> Callable[[], int]:
    """The engine's unfinished requests, as the engine itself counts them."""

    def unfinished() -> int:
        return loop_thread.call(engine.unfinished_requests)

    return unfinished


@pytest.fixture
def idle_engine(engine_requests: Callable[[], int]) -> Callable[[], None]:
    """Waits, however long it takes, until the engine has no request left running."""

    def wait_idle() -> None:
        wait_for(lambda: engine_requests() == 0)

    return wait_idle
