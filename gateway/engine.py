"""The engine adapter: the only module that imports vLLM.

It builds `AsyncLLM`, translates `SamplingOptions` into vLLM's parameters, and streams
`EngineStep`s. Closing a stream (or cancelling the task that iterates it) aborts the engine
request, in every phase: vLLM's `generate` aborts on `GeneratorExit` and `CancelledError`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from typing import Any

import msgspec
from vllm import SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.generate.beam_search.online import BeamSearchOnlineMixin
from vllm.inputs.engine import tokens_input
from vllm.sampling_params import BeamSearchParams, RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM

from gateway.config import EngineSettings
from protocols.errors import ErrorKind, GenerationError
from protocols.generation import SamplingOptions

log = logging.getLogger(__name__)
GIB = 1 << 30


class EngineStep(msgspec.Struct):
    """What one engine output adds to one request."""

    text: str
    token_ids: Sequence[int]
    finished: bool
    is_eos: bool
    finish_reason: str | None
    cached_tokens: int


def engine_args(settings: EngineSettings, model: str) -> AsyncEngineArgs:
    return AsyncEngineArgs(
        model=model,
        served_model_name=[settings.served_model_name] if settings.served_model_name else None,
        max_model_len=settings.max_model_len,
        kv_cache_memory_bytes=int(settings.kv_cache_gib * GIB),
        enforce_eager=settings.enforce_eager,
        enable_prefix_caching=settings.enable_prefix_caching,
        tensor_parallel_size=settings.tensor_parallel_size,
        pipeline_parallel_size=settings.pipeline_parallel_size,
        dtype=settings.dtype,
        seed=settings.seed,
    )


def sampling_params(options: SamplingOptions) -> SamplingParams:
    sample = options.do_sample and options.temperature > 0
    return SamplingParams(
        n=1,
        max_tokens=options.max_new_tokens,
        min_tokens=options.min_tokens,
        temperature=options.temperature if sample else 0.0,
        top_p=options.top_p if sample else 1.0,
        top_k=max(options.top_k, 0) if sample else 0,
        repetition_penalty=options.repetition_penalty,
        seed=options.seed,
        stop=list(options.stop) or None,
        ignore_eos=options.ignore_eos,
        output_kind=RequestOutputKind.DELTA,
    )


def _is_eos(finish_reason: str | None, stop_reason: int | str | None) -> bool:
    # "stop" with a string stop_reason was a stop string; otherwise an EOS / stop token.
    return finish_reason == "stop" and not isinstance(stop_reason, str)


_FAILED = frozenset({"error", "abort"})


def _engine_failure(reason: str | None) -> GenerationError:
    return GenerationError(ErrorKind.ENGINE_ERROR, f"The engine ended the request: {reason}")


class _BeamSearcher(BeamSearchOnlineMixin):
    def __init__(self, llm: AsyncLLM) -> None:
        self.engine_client = llm
        self.renderer = llm.renderer


class Engine:
    """One vLLM engine, shared by every protocol."""

    def __init__(self, llm: AsyncLLM, max_model_len: int) -> None:
        self._llm = llm
        self._ids = itertools.count()
        self._beams = _BeamSearcher(llm)
        self.tokenizer: Any = llm.get_tokenizer()
        self.max_model_len = max_model_len
        name = llm.model_config.served_model_name
        self.model_name: str = name if isinstance(name, str) else str(name[0]) if name else ""

    @classmethod
    async def start(cls, settings: EngineSettings, model: str) -> Engine:
        """Build the engine in a worker thread, so the event loop keeps serving meanwhile."""
        args = engine_args(settings, model)
        llm = await asyncio.to_thread(AsyncLLM.from_engine_args, args)
        return cls(llm, llm.model_config.max_model_len)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    def unfinished_requests(self) -> int:
        return int(self._llm.get_num_unfinished_requests())

    @property
    def healthy(self) -> bool:
        return not self._llm.errored

    async def stream(
        self, token_ids: list[int], options: SamplingOptions
    ) -> AsyncIterator[EngineStep]:
        request_id = f"gw-{next(self._ids)}"
        outputs = self._llm.generate(tokens_input(token_ids), sampling_params(options), request_id)
        try:
            async with aclosing(outputs):
                async for output in outputs:
                    completion = output.outputs[0]
                    reason = completion.finish_reason
                    if reason in _FAILED:
                        raise _engine_failure(reason)
                    yield EngineStep(
                        completion.text,
                        completion.token_ids,
                        output.finished,
                        _is_eos(reason, completion.stop_reason),
                        reason,
                        output.num_cached_tokens or 0,
                    )
        except (asyncio.CancelledError, GeneratorExit):
            # vLLM aborts on close too, except when cancelled inside its add_request, before
            # it holds the request's queue: abort by id as well (a second abort is a no-op).
            await self._llm.abort(request_id)
            raise

    async def beam_search(self, token_ids: list[int], options: SamplingOptions) -> EngineStep:
        """Run vLLM's beam search to the end and return the best beam as one step."""
        room = self.max_model_len - len(token_ids)
        params = BeamSearchParams(
            beam_width=options.num_beams,
            max_tokens=min(options.max_new_tokens, room),
            ignore_eos=options.ignore_eos,
            temperature=options.temperature if options.do_sample else 0.0,
            length_penalty=options.length_penalty,
        )
        request_id = f"gw-beam-{next(self._ids)}"
        outputs = self._beams.beam_search(tokens_input(token_ids), request_id, params)
        async with aclosing(outputs):
            async for output in outputs:
                best = output.outputs[0]
                if best.finish_reason in _FAILED:
                    raise _engine_failure(best.finish_reason)
                return EngineStep(
                    best.text,
                    best.token_ids,
                    True,
                    _is_eos(best.finish_reason, best.stop_reason),
                    best.finish_reason,
                    0,
                )
        raise _engine_failure("no output")

    def shutdown(self) -> None:
        self._llm.shutdown()
