"""Real servers for tests: one event loop in a thread, one eager engine, uvicorn on free ports.

The engine is bound to the loop it was built in, so every server of the session runs on that
loop too; tests talk to them over loopback with real clients from the main thread.
"""

from __future__ import annotations

import asyncio
import socket
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import uvicorn
from starlette.applications import Starlette

from gateway.app import EngineLoader, create_app
from gateway.state import Gateway, gateway_of_app
from gateway.config import Settings, load_settings
from gateway.engine import Engine

T = TypeVar("T")
SCRATCH = Path(tempfile.mkdtemp(prefix="llm-gateway-tests-"))


def gateway_settings(**env: str) -> Settings:
    """Settings as a user would write them, from environment-style strings; no .env read."""
    base = {
        "ENFORCE_EAGER": "true",
        "MAX_MODEL_LEN": "2048",
        "KV_CACHE_GIB": "1",
        "FEEDBACK_DB": str(SCRATCH / "feedback.sqlite3"),
    }
    return load_settings({**base, **env}, dotenv_path=None)


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="serving", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 600) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[[], T]) -> T:
        async def call() -> T:
            return fn()

        return self.run(call())

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RunningServer:
    def __init__(self, loop: LoopThread, app: Starlette, port: int) -> None:
        self.loop = loop
        self.app = app
        self.port = port
        self.http = f"http://127.0.0.1:{port}"
        self.ws = f"ws://127.0.0.1:{port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
        self._server = uvicorn.Server(config)
        self._task = asyncio.run_coroutine_threadsafe(self._server.serve(), loop.loop)
        deadline = time.monotonic() + 30
        while not self._server.started:
            if self._task.done():
                self._task.result()
            if time.monotonic() > deadline:
                raise TimeoutError("uvicorn did not start")
            time.sleep(0.02)

    @property
    def gateway(self) -> Gateway:
        return gateway_of_app(self.app)

    def stop(self) -> None:
        self._server.should_exit = True
        self._task.result(30)


def start_server(
    loop: LoopThread, settings: Settings, load: EngineLoader, owns_engine: bool = False
) -> RunningServer:
    app = create_app(settings, load, owns_engine=owns_engine)
    return RunningServer(loop, app, free_port())


def shared_loader(
    engine: Engine, gate: Callable[[], Awaitable[None]] | None = None
) -> EngineLoader:
    async def load() -> Engine:
        if gate is not None:
            await gate()
        return engine

    return load


@contextmanager
def loading_server(
    loop: LoopThread, engine: Engine
) -> Iterator[tuple[RunningServer, Callable[[], None]]]:
    """A server whose engine stays loading until the `finish_loading()` it yields is called."""
    gate = asyncio.Event()

    async def wait() -> None:
        await gate.wait()

    server = start_server(loop, gateway_settings(), shared_loader(engine, wait))
    try:
        yield server, lambda: loop.call(gate.set)
    finally:
        server.stop()
