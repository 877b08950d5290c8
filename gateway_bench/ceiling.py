"""The in-process ceiling: vLLM's `AsyncLLM` used directly, no gateway code on the path.

The engine is built the way the gateway builds its own (`gateway.engine.engine_args`), with
the same CPU settings (the resolved dtype and `engine_environment()`, see machine.py), and
streamed with `RequestOutputKind.DELTA`: no HTTP, no JSON, no second process for the
frontend. Imports vLLM: only imported when this target runs.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from vllm import SamplingParams
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM

from gateway.config.settings import EngineSettings
from gateway.engine.engine_args import engine_args
from gateway_bench.metrics import BenchError, Record
from gateway_bench.workload import Request


@contextmanager
def environment(variables: Mapping[str, str]) -> Iterator[None]:
    """`variables` in os.environ meanwhile (vLLM reads them when it spawns its engine core);
    the previous values afterwards."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


async def start_llm(settings: EngineSettings, model: str, variables: Mapping[str, str]) -> AsyncLLM:
    """`settings` already hold the resolved dtype; built in a worker thread."""
    args = engine_args(settings, model)
    with environment(variables):
        return await asyncio.to_thread(AsyncLLM.from_engine_args, args)


async def generate(llm: AsyncLLM, request: Request, logprobs: int | None, record: Record) -> None:
    params = SamplingParams(
        max_tokens=request.max_new_tokens,
        temperature=0.0,
        ignore_eos=True,
        logprobs=logprobs,
        output_kind=RequestOutputKind.DELTA,
    )
    async for output in llm.generate(request.prompt, params, request.request_id):
        completion = output.outputs[0]
        if logprobs is not None and completion.token_ids and completion.logprobs is None:
            raise BenchError("logprobs were asked for and the engine returned none")
        record.counted(len(completion.token_ids), bool(completion.text))
    record.finish_counted()
