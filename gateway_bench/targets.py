"""The servers under test: vLLM's OpenAI server and the gateway (the in-process ceiling is
ceiling.py).

Servers run as subprocesses on free loopback ports, each in its own process group (vLLM
starts an engine-core child), with their output in a log file next to the report. The bench
waits for `/health` to answer 200, measures, and stops the group before the next target
starts, so two engines never share the machine.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from asyncio.subprocess import Process
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from types import MappingProxyType
from typing import Any, NamedTuple

import aiohttp
import msgspec

from gateway.config.settings import EngineSettings, served_model_name
from gateway.engine.cpu_defaults import resolve_kv_block_size, resolve_max_num_batched_tokens
from gateway_bench import machine
from gateway_bench.options import Options
from gateway_bench.worker import Context

GIB = 1 << 30
_STOP_GRACE_S = 30.0


@dataclass(frozen=True)
class Endpoint:
    """A server to measure; `pid` (for memory figures) is known when the bench started it."""

    url: str
    pid: int | None = None
    start_s: float | None = None
    model: str = ""

    def context(
        self, session: aiohttp.ClientSession, profiles: Path | None = None, model: str = ""
    ) -> Context:
        """What the workers measuring this server share; `model`: the name requests carry."""
        pids = () if self.pid is None else (self.pid,)
        return Context(session, self.url, model, pids=pids, profiles=profiles)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Model(msgspec.Struct):
    id: str


class _Models(msgspec.Struct):
    data: list[_Model]


async def served_model(session: aiohttp.ClientSession, url: str) -> str:
    """The first model a running OpenAI-compatible server lists under GET /v1/models."""
    async with session.get(url + "/v1/models") as response:
        response.raise_for_status()
        models = msgspec.json.decode(await response.read(), type=_Models)
    if not models.data:
        raise RuntimeError(f"{url} serves no model")
    return models.data[0].id


def vllm_server_command(
    settings: EngineSettings, model: str, name: str, port: int, dtype: str | None
) -> list[str]:
    """`dtype` None: vLLM's own defaults (the "defaults" target); otherwise the gateway's dtype,
    step budget and KV block size for this machine (gateway/engine/cpu_defaults.py)."""
    caching = (
        "--enable-prefix-caching"
        if settings.enable_prefix_caching
        else "--no-enable-prefix-caching"
    )
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    command += ["--served-model-name", name, "--host", "127.0.0.1", "--port", str(port)]
    command += ["--max-model-len", str(settings.max_model_len)]
    command += ["--kv-cache-memory-bytes", str(int(settings.kv_cache_gib * GIB))]
    command += ["--seed", str(settings.seed), caching, "--uvicorn-log-level", "warning"]
    if dtype is not None:
        command += ["--dtype", dtype]
        device = machine.device()
        budget = resolve_max_num_batched_tokens(settings.max_num_batched_tokens, device)
        if budget:
            command += ["--max-num-batched-tokens", str(budget)]
        block = resolve_kv_block_size(settings.kv_block_size, device)
        if block:
            command += ["--block-size", str(block)]
    if settings.enforce_eager:
        command.append("--enforce-eager")
    return command


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


async def _wait_ready(process: Process, url: str, log: Path, limit_s: float) -> None:
    deadline = perf_counter() + limit_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        while True:
            if process.returncode is not None:
                raise RuntimeError(
                    f"{log.stem} exited with {process.returncode} before it was ready; "
                    f"the end of {log}:\n{_tail(log)}"
                )
            try:
                async with session.get(url + "/health") as response:
                    if response.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            if perf_counter() > deadline:
                raise TimeoutError(f"{log.stem} was not ready after {limit_s:.0f} s (see {log})")
            await asyncio.sleep(0.5)


def _signal_group(process: Process, signum: signal.Signals) -> None:
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signum)  # the group this bench started, no other


async def _stop(process: Process) -> None:
    if process.returncode is not None:
        return
    _signal_group(process, signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), _STOP_GRACE_S)
    except TimeoutError:
        _signal_group(process, signal.SIGKILL)
        await process.wait()


@asynccontextmanager
async def process_group(
    command: list[str], env: dict[str, str], log: Path
) -> AsyncIterator[Process]:
    """A subprocess in a process group of its own (its children included), its output in `log`;
    the group stopped on exit."""
    out = await asyncio.to_thread(log.open, "ab")
    try:
        process = await asyncio.create_subprocess_exec(
            *command,
            env={**os.environ, **env},
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        out.close()  # the child holds its own copy
    try:
        yield process
    finally:
        await _stop(process)


@asynccontextmanager
async def server(
    command: list[str],
    env: dict[str, str],
    port: int,
    log: Path,
    limit_s: float,
    model: str = "",
) -> AsyncIterator[Endpoint]:
    """A server subprocess, ready to measure; stopped (with its children) on exit."""
    began = perf_counter()
    say(f"starting {log.stem} on port {port}")
    async with process_group(command, env, log) as process:
        url = f"http://127.0.0.1:{port}"
        await _wait_ready(process, url, log, limit_s)
        yield Endpoint(url, process.pid, round(perf_counter() - began, 1), model)


def say(message: str) -> None:
    """A line on stderr, above the progress bar when there is one."""
    from tqdm import tqdm

    tqdm.write(f"llm-gateway bench: {message}", file=sys.stderr)


def model_dir(options: Options) -> str:
    """The options' model, or the embedded default model's directory (converted once)."""
    if options.model:
        return options.model
    from gateway.engine.default_model import prepare_default_model

    return str(prepare_default_model(progress=say))


def tokenizer(model: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


class Launch(NamedTuple):
    """A server to start: its command line, what it adds to the environment, its model's name."""

    command: list[str]
    env: dict[str, str]
    served: str


def vllm_launch(
    options: Options, model: str, port: int, *, own_defaults: bool = False, args: Sequence[str] = ()
) -> Launch:
    """vLLM's server with the gateway's CPU defaults for this machine (`own_defaults`: vLLM's)."""
    settings, defaults = options.engine_settings(), machine.cpu_defaults(options.dtype)
    served = served_model_name(settings)
    dtype = None if own_defaults else defaults.dtype
    command = vllm_server_command(settings, model, served, port, dtype) + list(args)
    return Launch(command, {} if own_defaults else dict(defaults.environment), served)


def gateway_launch(
    options: Options, port: int, env: Mapping[str, str] = MappingProxyType({}), dtype: str = ""
) -> Launch:
    """A gateway on the options' engine (`dtype`: the resolved one), `env` added; no .env file:
    the engine settings come from the bench's options, like the other targets'."""
    settings = options.engine_settings(dtype or None)
    script = Path(sys.executable).with_name("llm-gateway")
    head = [str(script)] if script.is_file() else [sys.executable, "-m", "gateway.cli"]
    command = [*head, "serve", "--host", "127.0.0.1", "--port", str(port), "--env-file", os.devnull]
    environment = {
        "MODEL": settings.model,
        "MAX_MODEL_LEN": str(settings.max_model_len),
        "KV_CACHE_GIB": str(settings.kv_cache_gib),
        "ENFORCE_EAGER": str(settings.enforce_eager).lower(),
        "ENABLE_PREFIX_CACHING": str(settings.enable_prefix_caching).lower(),
        "DTYPE": settings.dtype,
        "SEED": str(settings.seed),
        "LOG_LEVEL": "warning",
    }
    return Launch(command, {**environment, **env}, served_model_name(settings))


def started(
    options: Options, out: Path, name: str, launch: Callable[[int], Launch]
) -> AbstractAsyncContextManager[Endpoint]:
    """The server `launch(port)` describes, started for a run, its output in `out/NAME.log`."""
    port = free_port()
    command, env, served = launch(port)
    return server(command, env, port, out / f"{name}.log", options.start_timeout, served)


def started_gateway(
    options: Options,
    out: Path,
    name: str = "gateway",
    env: Mapping[str, str] = MappingProxyType({}),
    dtype: str = "",
) -> AbstractAsyncContextManager[Endpoint]:
    return started(options, out, name, lambda port: gateway_launch(options, port, env, dtype))
