"""The engine wrapper: the gateway's only way to vLLM (gateway/engine/bulk_scheduler.py runs
inside vLLM's engine process, loaded by it). What it needs of vLLM's internals is in
gateway/engine/vllm_seam.py; a constraint is compiled within a budget before submission by
gateway/engine/constraint_check.py.

`VllmEngine` builds `AsyncLLM` (engine_args.py), submits requests with vLLM's parameters
(sampling.py) and streams `EngineStep`s (outputs.py), their stop strings met as
protocols/stop_strings.py says; beam search (beam_requests.py), LoRA adapters
(lora_loading.py) and its death (death_watch.py) are modules of their own. Closing a stream (or
cancelling the task that iterates it) aborts the engine request, in every phase: vLLM's
`generate` aborts on `GeneratorExit` and `CancelledError`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from functools import partial
from pathlib import Path

import msgspec
from vllm import RequestOutput, SamplingParams
from vllm.inputs.engine import tokens_input
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM

from gateway.config.adapters import configured_adapters, lora_enabled
from gateway.config.settings import EngineSettings, served_model_name
from gateway.engine import death_watch, lora_loading
from gateway.engine.beam_requests import searched
from gateway.engine.constraint_check import CompileLimits, ConstraintChecker
from gateway.engine.contract import TokenizerSide
from gateway.engine.engine_args import engine_args, engine_dtype, shutdown_grace_seconds
from gateway.engine.engine_errors import engine_failure, translated
from gateway.engine.lora import Adapters
from gateway.engine.meter import Meter
from gateway.engine.outputs import EngineStep, OutputReader, eos_token_ids
from gateway.engine.sampling import checked_params
from gateway.engine.scheduler_view import SchedulerView
from gateway.engine.vllm_seam import SchedulerStatsLogger, request_timings
from gateway.observability.tracing import EngineTimings, engine_phases
from protocols.errors import ErrorKind, GenerationError
from protocols.generation import SamplingOptions
from protocols.stop_strings import StopStrings

log = logging.getLogger(__name__)


class VllmEngine(TokenizerSide):
    """One vLLM engine, shared by every protocol: an `Engine` (gateway/engine/contract.py)."""

    def __init__(
        self,
        llm: AsyncLLM,
        max_model_len: int,
        dtype_reason: str = "",
        scheduler: SchedulerView | None = None,
        adapters: Adapters | None = None,
        limits: CompileLimits | None = None,
    ) -> None:
        tokenizer = llm.get_tokenizer()
        super().__init__(
            tokenizer,
            eos_token_ids(llm, tokenizer),
            max_model_len,
            str(llm.model_config.dtype).removeprefix("torch."),
            dtype_reason,
            adapters or Adapters({}, enabled=False),
            scheduler or SchedulerView(),
        )
        self.llm = llm
        self.constraints = ConstraintChecker(llm, limits or CompileLimits())
        self._ids = itertools.count()
        self._reader = OutputReader(tokenizer)
        self._closing = False
        self.typical_sampling = False  # the logits processor loaded (TYPICAL_SAMPLING)

    def _honoured(self, options: SamplingOptions) -> SamplingOptions:
        """`options` less typical_p where the engine has no typical sampling (ignored, logged)."""
        if options.typical_p == 1.0 or self.typical_sampling:
            return options
        log.warning("typical_p ignored: TYPICAL_SAMPLING is off on this engine")
        return msgspec.structs.replace(options, typical_p=1.0)

    @classmethod
    async def start(cls, settings: EngineSettings, model: str) -> VllmEngine:
        """Build the engine in a worker thread, so the event loop keeps serving meanwhile.

        On the CPU backend the dtype and thread settings follow the CPU
        (gateway/engine/cpu_defaults.py).
        """
        dtype, reason = engine_dtype(settings.dtype, "engine")
        args = engine_args(msgspec.structs.replace(settings, dtype=dtype), model)
        view = SchedulerView()
        stats = partial(SchedulerStatsLogger, view)
        adapters = Adapters(
            configured_adapters(settings),
            enabled=lora_enabled(settings),
            base=served_model_name(settings),
        )
        llm = await asyncio.to_thread(AsyncLLM.from_engine_args, args, stat_loggers=[stats])
        limits = CompileLimits(
            settings.constraint_compile_seconds,
            settings.constraint_compile_memory_mib,
            settings.constraint_compile_workers,
        )
        engine = cls(llm, llm.model_config.max_model_len, reason, view, adapters, limits)
        engine.typical_sampling = bool(args.logits_processors)
        engine.constraints.start()
        return engine

    async def load_adapter(self, name: str, path: Path, lora_id: int | None = None) -> None:
        """gateway/engine/lora_loading.py's `load_adapter`, into this engine."""
        await lora_loading.load_adapter(self.llm, self.adapters, name, path, lora_id)

    async def unload_adapter(self, name: str) -> bool:
        """gateway/engine/lora_loading.py's `unload_adapter`, from this engine."""
        return await lora_loading.unload_adapter(self.llm, self.adapters, name)

    def _stop_strings(self, options: SamplingOptions) -> StopStrings:
        spell = partial(self._reader.piece, skip_special_tokens=options.skip_special_tokens)
        return StopStrings(options.stop, options.include_stop_str_in_output, spell, self.retokenize)

    def unfinished_requests(self) -> int:
        return int(self.llm.get_num_unfinished_requests())

    @property
    def healthy(self) -> bool:
        return not self.llm.errored

    async def stream(
        self,
        token_ids: list[int],
        options: SamplingOptions,
        meter: Meter | None = None,
        priority: int = 0,
        adapter: str | None = None,
        caller: str = "",
    ) -> AsyncGenerator[EngineStep, None]:
        """The steps of one sequence (options.n must be 1), as the engine produces them
        (`caller`: whose constraint compile it is, gateway/engine/compile_pool.py).

        Each step's text is all of its tokens' text: a stop string that ends the request is
        kept (protocols/stop_strings.py's `Holdback` cuts it with its tokens), a stop token's
        text only when asked for; the last step says what its last token had `beyond` a stop
        string.
        """
        request_id = f"gw-{next(self._ids)}"
        stops = self._stop_strings(options)
        params = checked_params(self._honoured(options), keep_stop_strings=stops.kept_by_engine)
        outputs = self._generate(token_ids, params, request_id, priority, adapter)
        first = True
        constrained = params.structured_outputs is not None
        span = meter.span if meter is not None else None
        async with self._tracked(request_id, len(token_ids), meter), aclosing(outputs):
            await self.constraints.check(params, caller, span)
            async for output in outputs:
                step = self._reader.step(output, output.outputs[0], first, constrained)
                first = False
                step.text = stops.streamed_text(step.text, step.is_eos, step.token_ids)
                if step.finished:
                    step.beyond = stops.beyond(
                        step.text, step.stop_reason, step.token_ids, step.tokens
                    )
                    if span is not None and (timings := request_timings(output)) is not None:
                        engine_phases(span, EngineTimings(*timings))
                if meter is not None:
                    meter.step(len(step.token_ids), step.cached_tokens, step.finished)
                yield step

    def _generate(
        self,
        token_ids: list[int],
        params: SamplingParams,
        request_id: str,
        priority: int,
        adapter: str | None,
    ) -> AsyncGenerator[RequestOutput, None]:
        return self.llm.generate(
            tokens_input(token_ids),
            params,
            request_id,
            lora_request=self.adapters.lora_request(adapter),
            priority=priority,
        )

    async def complete(
        self,
        token_ids: list[int],
        options: SamplingOptions,
        meter: Meter | None = None,
        priority: int = 0,
        adapter: str | None = None,
        caller: str = "",
    ) -> list[EngineStep]:
        """Every sequence of a request (options.n of them), each as one final step: one that
        ended at a stop string with only the tokens of its text."""
        request_id = f"gw-{next(self._ids)}"
        params = checked_params(self._honoured(options), RequestOutputKind.FINAL_ONLY)
        outputs = self._generate(token_ids, params, request_id, priority, adapter)
        constrained = params.structured_outputs is not None
        stops = self._stop_strings(options)
        span = meter.span if meter is not None else None
        async with self._tracked(request_id, len(token_ids), meter), aclosing(outputs):
            await self.constraints.check(params, caller, span)
            async for output in outputs:
                if output.finished:
                    if span is not None and (timings := request_timings(output)) is not None:
                        engine_phases(span, EngineTimings(*timings))
                    steps = [
                        _cut(self._reader.step(output, c, True, constrained), stops)
                        for c in output.outputs
                    ]
                    if meter is not None:
                        tokens = sum(len(s.token_ids) for s in steps)
                        meter.step(tokens, steps[0].cached_tokens, True)
                    return steps
        raise engine_failure("no output")

    @asynccontextmanager
    async def _tracked(
        self, request_id: str, prompt_tokens: int, meter: Meter | None
    ) -> AsyncIterator[None]:
        """Meter one engine request, and abort it however its consumer stops listening."""
        if meter is not None:
            meter.started(prompt_tokens)
        try:
            yield
        except (asyncio.CancelledError, GeneratorExit):
            # vLLM aborts on close too, except when cancelled inside its add_request, before
            # it holds the request's queue: abort by id as well (a second abort is a no-op).
            await self.llm.abort(request_id)
            raise
        except Exception as e:
            failure = translated(e)
            if meter is not None:
                kind = (
                    failure.kind if isinstance(failure, GenerationError) else ErrorKind.ENGINE_ERROR
                )
                meter.outcome = kind.value
            if failure is not e:
                raise failure from e
            raise
        finally:
            if meter is not None:
                meter.ended()

    async def beam_search(
        self,
        token_ids: list[int],
        options: SamplingOptions,
        meter: Meter | None = None,
        priority: int = 0,
        adapter: str | None = None,
        caller: str = "",
    ) -> list[EngineStep]:
        """Beam search as transformers does it (gateway/engine/beam_requests.py), run to the
        end: every beam, best first (what it generated counts toward a caller's tokens,
        whichever beams the protocol answers with); it has no constraint to compile for
        `caller`."""
        request_id = f"gw-beam-{next(self._ids)}"
        # Resolved once: each step is an engine request, and the adapter may be unloaded
        # (its name then unknown) while the search runs.
        lora = self.adapters.lora_request(adapter)
        async with self._tracked(request_id, len(token_ids), meter):
            steps = await searched(
                self.llm,
                self._reader,
                token_ids,
                options,
                room=self.max_model_len - len(token_ids),
                eos_token_ids=self.eos_token_ids,
                request_id=request_id,
                priority=priority,
                lora=lora,
                span=meter.span if meter is not None else None,
            )
        if meter is not None:
            meter.step(sum(len(s.token_ids) for s in steps), 0, True)
        return steps

    def on_death(self, callback: Callable[[str], None]) -> None:
        """gateway/engine/death_watch.py's `on_death`, unless `shutdown` stopped the engine."""
        death_watch.on_death(self.llm, callback, lambda: self._closing)

    def core_pids(self) -> list[int]:
        return death_watch.core_pids(self.llm)

    def death_reason(self) -> str:
        return death_watch.death_reason(self.llm)

    def shutdown(self) -> None:
        """Stops the engine-core process, or cleans up after one that died (twice is harmless)."""
        if self._closing:
            return
        self._closing = True
        self.constraints.close()
        self.llm.shutdown(timeout=shutdown_grace_seconds())
        # vLLM kills an engine core that outlives its grace period without reaping it: a zombie
        # until some other child is started. Reaped here, as its engine is unloaded.
        multiprocessing.active_children()


def _cut(step: EngineStep, stops: StopStrings) -> EngineStep:
    """A whole sequence that ended at a stop string, with only the tokens of its text."""
    cut = stops.cut(step.text, step.stop_reason, step.token_ids, step.tokens)
    if cut is None:
        return step
    return msgspec.structs.replace(
        step,
        token_ids=cut.token_ids,
        tokens=cut.tokens if step.tokens is not None else None,
        generated=len(step.token_ids),
    )
