"""Session fixtures: one eager engine on the default model, and a server on it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

import pytest

from clients import wait_ready
from gateway.default_model import prepare_default_model
from gateway.engine import Engine
from serving import LoopThread, RunningServer, gateway_settings, shared_loader, start_server

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


@pytest.fixture(scope="session")
def loop_thread() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.stop()


@pytest.fixture(scope="session")
def engine(loop_thread: LoopThread) -> Iterator[Engine]:
    model = str(prepare_default_model())
    built = loop_thread.run(Engine.start(gateway_settings().engine, model))
    yield built
    loop_thread.call(built.shutdown)


@pytest.fixture(scope="session")
def server(loop_thread: LoopThread, engine: Engine) -> Iterator[RunningServer]:
    running = start_server(loop_thread, gateway_settings(), shared_loader(engine))
    wait_ready(running.http)
    yield running
    running.stop()


@pytest.fixture
def make_server(loop_thread: LoopThread, engine: Engine) -> Iterator[Callable[..., RunningServer]]:
    """Another server on the shared engine, with its own settings (admission, store...)."""
    started: list[RunningServer] = []

    def make(**env: str) -> RunningServer:
        running = start_server(loop_thread, gateway_settings(**env), shared_loader(engine))
        started.append(running)
        wait_ready(running.http)
        return running

    yield make
    for running in started:
        running.stop()


@pytest.fixture
def idle_engine(loop_thread: LoopThread, engine: Engine) -> Iterator[Callable[[], None]]:
    """Asserts, after a test, that the engine has no request left running."""

    def wait_idle(timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while (left := loop_thread.call(engine.unfinished_requests)) > 0:
            assert time.monotonic() < deadline, f"{left} engine requests still running"
            time.sleep(0.05)

    yield wait_idle
