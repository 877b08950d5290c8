"""Real servers for tests: one event loop in a thread, one eager engine, uvicorn on free ports.

The engine is bound to the loop it was built in, so every server of the session runs on that
loop too; tests talk to them over loopback with real clients from the main thread. Nothing
here waits against a clock: pytest-timeout's per-test limit is the only safety net.
"""

from __future__ import annotations

import asyncio
import math
import os
import socket
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from starlette.applications import Starlette

from clients import MAX_MODEL_LEN, POLL, wait_ready
from gateway.config.loading import load_settings
from gateway.config.settings import Settings
from gateway.server import GatewayServer, uvicorn_config
from protocols.errors import ErrorKind, GenerationError

if TYPE_CHECKING:  # they import vllm: imported where a server is built, not at collection
    from gateway.engine.loader import EngineLoader
    from gateway.engine.vllm_engine import VllmEngine
    from gateway.state import Gateway

T = TypeVar("T")
SCRATCH = Path(tempfile.mkdtemp(prefix="llm-gateway-tests-"))


STEP_TOKENS = 128


def gateway_settings(**env: str) -> Settings:
    """Settings as a user would write them, from environment-style strings; no .env read."""
    base = {
        "ENFORCE_EAGER": "true",
        # The same numbers on every machine (bfloat16 keeps about 3 digits, and some CPUs
        # emulate it): greedy and beam answers can then be compared with transformers' own.
        "DTYPE": "float32",
        "MAX_MODEL_LEN": str(MAX_MODEL_LEN),
        # Small, so that a few long requests overflow it (tests/test_priorities.py: preemption).
        "KV_CACHE_GIB": "0.25",
        # Bulk held to 4 running while an interactive request is present (the engine's
        # scheduler pauses the rest: tests/test_priorities.py). No fewer: a bulk stream past
        # the cap waits while endless interactive streams run, and unending_streams.py starts
        # 4 bulk streams beside 12 endless interactive ones.
        "BULK_MAX_RUNNING": "4",
        # A step's tokens while an interactive request is present (`auto`: 256 on a CPU), so
        # that a long prompt takes many steps (tests/test_priorities.py: prompts first).
        "INTERACTIVE_STEP_TOKENS": str(STEP_TOKENS),
        "FEEDBACK_DB": str(SCRATCH / "feedback.sqlite3"),
        # No grammar refused for time on a slow or loaded machine (the default's 5 s is a
        # server's bound, not a test's): test_constraint_budget.py sets its own deadline.
        "CONSTRAINT_COMPILE_SECONDS": "600",
    }
    return load_settings({**base, **env}, dotenv_path=None)


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="serving", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def call(self, fn: Callable[[], T]) -> T:
        async def call() -> T:
            return fn()

        return self.run(call())

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def slow_network_listener(send_buffer_bytes: int) -> socket.socket:
    """A loopback listener whose connections keep at most about `send_buffer_bytes` unsent in
    the kernel (Linux doubles it; the accepted sockets inherit it, and it turns the kernel's
    autotuning off): a slow network's stand-in, so a client that does not read stops the
    server's writes after kilobytes rather than the megabytes loopback buffers hold."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer_bytes)
    listener.bind(("127.0.0.1", 0))
    return listener


class RunningServer:
    def __init__(
        self,
        loop: LoopThread,
        app: Starlette,
        settings: Settings,
        port: int,
        sockets: list[socket.socket] | None = None,
    ) -> None:
        self.loop = loop
        self.app = app
        self.port = port
        self.http = f"http://127.0.0.1:{port}"
        self.ws = f"ws://127.0.0.1:{port}"
        config = uvicorn_config(app, settings, "127.0.0.1", port, log_level="warning")
        self._server = GatewayServer(config, app)
        self._task = asyncio.run_coroutine_threadsafe(self._server.serve(sockets), loop.loop)
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises why it could not start
            time.sleep(POLL)

    @property
    def gateway(self) -> Gateway:
        from gateway.state import gateway_of_app

        return gateway_of_app(self.app)

    def drain(self) -> None:
        """What SIGTERM does: drain (returns once it began), then stop."""
        self.loop.call(self._server.begin_drain)

    def stopped(self) -> bool:
        return self._task.done()

    def stop(self) -> None:
        self._server.should_exit = True
        self._task.result()


def start_server(
    loop: LoopThread,
    settings: Settings,
    load: EngineLoader,
    owns_engine: bool = False,
    send_buffer_bytes: int | None = None,
) -> RunningServer:
    """A server on a free port; with `send_buffer_bytes`, behind a slow network's stand-in
    (`slow_network_listener`)."""
    from gateway.app import create_app

    app = create_app(settings, load, owns_engine=owns_engine)
    if send_buffer_bytes is None:
        return RunningServer(loop, app, settings, free_port())
    listener = slow_network_listener(send_buffer_bytes)
    return RunningServer(loop, app, settings, listener.getsockname()[1], [listener])


def own_engine_server(loop: LoopThread, settings: Settings) -> RunningServer:
    """A ready server on an engine of its own, the default model's, built from `settings`;
    stopping the server stops its engine."""

    async def load() -> VllmEngine:
        from gateway.engine.default_model import prepare_default_model
        from gateway.engine.vllm_engine import VllmEngine

        return await VllmEngine.start(settings.engine, str(prepare_default_model()))

    running = start_server(loop, settings, load, owns_engine=True)
    try:
        wait_ready(running.http)
    except BaseException:
        running.stop()
        raise
    return running


def shared_loader(
    engine: VllmEngine, gate: Callable[[], Awaitable[None]] | None = None
) -> EngineLoader:
    async def load() -> VllmEngine:
        if gate is not None:
            await gate()
        return engine

    return load


@contextmanager
def loading_server(
    loop: LoopThread, engine: VllmEngine, **env: str
) -> Iterator[tuple[RunningServer, Callable[[], None]]]:
    """A server (with `env`'s settings) whose engine stays loading until the
    `finish_loading()` it yields is called."""
    gate = asyncio.Event()

    async def wait() -> None:
        await gate.wait()

    server = start_server(loop, gateway_settings(**env), shared_loader(engine, wait))
    try:
        yield server, lambda: loop.call(gate.set)
    finally:
        server.stop()


class _FailingEngine:
    """The real engine, except that a prompt holding `marker` fails once it is admitted, as an
    engine error would: a fault the real engine cannot be made to produce on demand."""

    def __init__(self, engine: VllmEngine, marker: str) -> None:
        self._engine = engine
        self._marker = engine.encode(marker)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def stream(self, token_ids: list[int], *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        m = self._marker
        if any(token_ids[i : i + len(m)] == m for i in range(len(token_ids))):
            raise GenerationError(ErrorKind.ENGINE_ERROR, "injected engine failure")
        async for step in self._engine.stream(token_ids, *args, **kwargs):
            yield step


def failing_loader(engine: VllmEngine, marker: str) -> EngineLoader:
    """A loader of the shared engine whose prompts holding `marker` fail in the engine."""
    failing = cast("VllmEngine", _FailingEngine(engine, marker))

    async def load() -> VllmEngine:
        return failing

    return load


@contextmanager
def vllm_openai_server(loop: LoopThread) -> Iterator[str]:
    """vLLM's own OpenAI server on the default model, as gateway_settings() runs the gateway's
    engine (float32, eager, the same context, a small KV cache): a subprocess on a free port,
    started as the bench starts it (gateway_bench/targets.py). Yields its URL once /health
    answers 200; stopped, engine core included, when the context ends."""
    from gateway.config.settings import served_model_name
    from gateway.engine.cpu_defaults import engine_environment
    from gateway.engine.default_model import prepare_default_model
    from gateway_bench import targets

    settings = gateway_settings().engine
    port = free_port()
    model, name = str(prepare_default_model()), served_model_name(settings)
    command = targets.vllm_server_command(settings, model, name, port, settings.dtype)
    env = {**engine_environment(os.environ), "HF_HUB_OFFLINE": "1"}
    # No limit of its own: pytest-timeout ends a server that never gets ready.
    running = targets.server(command, env, port, SCRATCH / "vllm-server.log", math.inf)
    endpoint = loop.run(running.__aenter__())
    try:
        yield endpoint.url
    finally:
        loop.run(running.__aexit__(None, None, None))
