"""The engine adapter: the gateway's only way to vLLM (gateway/engine/bulk_scheduler.py runs inside
vLLM's engine process, loaded by it). What it needs of vLLM's internals is in
gateway/engine/vllm_seam.py; a constraint is compiled within a budget before submission by
gateway/engine/constraint_check.py.

It builds `AsyncLLM`, translates `SamplingOptions` into vLLM's parameters, and streams
`EngineStep`s. Closing a stream (or cancelling the task that iterates it) aborts the engine
request, in every phase: vLLM's `generate` aborts on `GeneratorExit` and `CancelledError`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from contextlib import aclosing, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from jinja2.exceptions import TemplateError
from vllm import CompletionOutput, RequestOutput, SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.exceptions import VLLMValidationError
from vllm.inputs.engine import tokens_input
from vllm.logprobs import Logprob
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError

from gateway.config.adapters import (
    check_adapter_path,
    configured_adapters,
    lora_enabled,
)
from gateway.config.settings import ConfigError, EngineSettings, served_model_name
from gateway.engine.beams import beam_search
from gateway.engine.bulk_scheduler import BulkCapScheduler, engine_config
from gateway.engine.constraint_check import CompileLimits, ConstraintChecker
from gateway.engine.cpu_defaults import (
    cpu_flags,
    engine_environment,
    reported_flags,
    resolve_bulk_cap,
    resolve_dtype,
    resolve_interactive_step_tokens,
    resolve_max_num_batched_tokens,
)
from gateway.engine.lora import Adapters
from gateway.engine.meter import Meter
from gateway.engine.vllm_seam import (
    SchedulerStatsLogger,
    core_processes,
    start_output_handler,
)
from protocols.constraints import UncompilableConstraint
from protocols.errors import ErrorKind, GenerationError, invalid
from protocols.events import Delta, TokenInfo, TopToken
from protocols.generation import SamplingOptions
from protocols.holdback import described

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest

log = logging.getLogger(__name__)
GIB = 1 << 30
_FAILED = frozenset({"error", "abort"})
_MAX_LOGPROBS = 20  # vLLM's default max_logprobs: beams beyond 10 see fewer candidates


class EngineStep(msgspec.Struct):
    """What one engine output adds to one sequence of a request.

    `tokens` is set when logprobs were asked for; `prompt_tokens` on the first step when
    prompt logprobs were (the first token's log-probability is NaN: it has none).
    """

    text: str
    token_ids: Sequence[int]
    finished: bool
    is_eos: bool
    finish_reason: str | None
    cached_tokens: int
    tokens: list[TokenInfo] | None = None
    prompt_tokens: list[TokenInfo] | None = None
    stop_reason: int | str | None = None
    generated: int | None = None  # tokens generated, where token_ids are fewer (a stop string)
    beyond: str = ""  # the last token's text past the stop string that ended the sequence


def engine_args(settings: EngineSettings, model: str) -> AsyncEngineArgs:
    bulk_cap = resolve_bulk_cap(settings.bulk_max_running, device_type())
    step_tokens = resolve_interactive_step_tokens(settings.interactive_step_tokens, device_type())
    own_scheduler = settings.scheduling_policy == "priority" and (bulk_cap > 0 or step_tokens > 0)
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
        scheduling_policy=settings.scheduling_policy,
        max_num_batched_tokens=resolve_max_num_batched_tokens(
            settings.max_num_batched_tokens, device_type()
        )
        or None,
        scheduler_cls=f"{BulkCapScheduler.__module__}.{BulkCapScheduler.__name__}"
        if own_scheduler
        else None,
        additional_config=engine_config(settings.bulk_priority, bulk_cap, step_tokens),
        # The cap's scheduler extends vLLM's synchronous one (a CPU engine's only kind).
        async_scheduling=False if own_scheduler else None,
        enable_lora=lora_enabled(settings),
        max_loras=settings.max_loras,
        max_lora_rank=settings.max_lora_rank,
    )


def device_type() -> str:
    """The device vLLM runs on here: cpu, cuda..."""
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def sampling_params(
    options: SamplingOptions,
    kind: RequestOutputKind = RequestOutputKind.DELTA,
    *,
    keep_stop_strings: bool = False,
) -> SamplingParams:
    sample = options.do_sample and options.temperature > 0
    return SamplingParams(
        n=options.n,
        max_tokens=options.max_new_tokens,
        min_tokens=options.min_tokens,
        temperature=options.temperature if sample else 0.0,
        top_p=options.top_p if sample else 1.0,
        top_k=max(options.top_k, 0) if sample else 0,
        min_p=options.min_p if sample else 0.0,
        repetition_penalty=options.repetition_penalty,
        presence_penalty=options.presence_penalty,
        frequency_penalty=options.frequency_penalty,
        seed=options.seed,
        stop=list(options.stop) or None,
        stop_token_ids=list(options.stop_token_ids) or None,
        logit_bias=dict(options.logit_bias) or None,
        structured_outputs=_structured(options),
        include_stop_str_in_output=options.include_stop_str_in_output or keep_stop_strings,
        ignore_eos=options.ignore_eos,
        logprobs=options.logprobs,
        prompt_logprobs=options.prompt_logprobs,
        skip_special_tokens=options.skip_special_tokens,
        spaces_between_special_tokens=options.spaces_between_special_tokens,
        output_kind=kind,
    )


def _structured(options: SamplingOptions) -> StructuredOutputsParams | None:
    if options.json_schema is not None:
        return StructuredOutputsParams(json=options.json_schema)
    if options.regex is not None:
        return StructuredOutputsParams(regex=options.regex)
    if options.grammar is not None:
        return StructuredOutputsParams(grammar=options.grammar)
    if options.choice is not None:
        return StructuredOutputsParams(choice=list(options.choice))
    return None


def _is_eos(finish_reason: str | None, stop_reason: int | str | None) -> bool:
    # "stop" with a string stop_reason was a stop string; otherwise an EOS / stop token.
    return finish_reason == "stop" and not isinstance(stop_reason, str)


def _refusal(error: VLLMValidationError) -> GenerationError:
    """vLLM's own check of a request ours let through (a stop token outside the vocabulary):
    the request's fault, not the engine's. A constraint its grammar backend cannot compile is
    refused before the request is submitted (gateway/engine/constraint_check.py)."""
    return GenerationError(ErrorKind.UNPROCESSABLE, f"The engine refused the request: {error}")


def _translated(error: Exception) -> Exception:
    if isinstance(error, VLLMValidationError):
        return _refusal(error)
    if isinstance(error, EngineDeadError):
        # The gateway builds another engine (gateway/engine/holder.py): the same request may
        # succeed if sent again. vLLM's own message points at a log the client cannot see.
        message = "The engine stopped while generating; retry once /health answers 200"
        return GenerationError(ErrorKind.ENGINE_UNAVAILABLE, message)
    return error


def _checked_params(options: SamplingOptions, *kind: RequestOutputKind) -> SamplingParams:
    """vLLM checks the parameters as it builds them: a refusal there is the request's fault."""
    try:
        return sampling_params(options, *kind)
    except VLLMValidationError as e:
        raise _refusal(e) from e


def _engine_failure(reason: str | None, constrained: bool = False) -> GenerationError:
    if constrained and reason == "error":
        # What vLLM's engine core answers when the grammar it compiles for the request fails
        # (after its own check let the constraint through), or rejects a token.
        message = "The engine could not hold the output to its constraint (its grammar failed)"
        return UncompilableConstraint(ErrorKind.UNPROCESSABLE, message)
    return GenerationError(ErrorKind.ENGINE_ERROR, f"The engine ended the request: {reason}")


def _eos_token_ids(llm: AsyncLLM, tokenizer: Any) -> frozenset[int]:
    """The tokenizer's end of sequence and the generation config's, as transformers uses."""
    configured = llm.model_config.try_get_generation_config().get("eos_token_id")
    ids = configured if isinstance(configured, list) else [configured]
    return frozenset(int(i) for i in [*ids, tokenizer.eos_token_id] if i is not None)


def _text(token_id: int, logprob: Logprob | None, tokenizer: Any) -> str:
    if logprob is not None and logprob.decoded_token is not None:
        return logprob.decoded_token
    return str(tokenizer.decode([token_id]))


class SchedulerView(msgspec.Struct):
    """What vLLM's scheduler last reported: its running batch and waiting queue (after the
    latest step), and the requests it preempted since the engine started."""

    preemptions: int = 0
    running: int = 0
    waiting: int = 0


class Engine:
    """One vLLM engine, shared by every protocol."""

    def __init__(
        self,
        llm: AsyncLLM,
        max_model_len: int,
        dtype_reason: str = "",
        scheduler: SchedulerView | None = None,
        adapters: Adapters | None = None,
        limits: CompileLimits | None = None,
    ) -> None:
        self.llm = llm
        self.constraints = ConstraintChecker(llm, limits or CompileLimits())
        self.adapters = adapters or Adapters({}, enabled=False)
        self.scheduler = scheduler or SchedulerView()
        self._ids = itertools.count()
        self.tokenizer: Any = llm.get_tokenizer()
        self._special = frozenset(int(i) for i in self.tokenizer.all_special_ids)
        self.eos_token_ids = _eos_token_ids(llm, self.tokenizer)
        self.max_model_len = max_model_len
        self.dtype = str(llm.model_config.dtype).removeprefix("torch.")
        self.dtype_reason = dtype_reason
        self._closing = False

    @classmethod
    async def start(cls, settings: EngineSettings, model: str) -> Engine:
        """Build the engine in a worker thread, so the event loop keeps serving meanwhile.

        On the CPU backend the dtype and thread settings follow the CPU
        (gateway/engine/cpu_defaults.py).
        """
        device = device_type()
        flags = cpu_flags()
        dtype, reason = resolve_dtype(settings.dtype, device, flags)
        if device == "cpu":
            os.environ.update(engine_environment(os.environ))
        log.info("engine dtype %s: %s (CPU flags: %s)", dtype, reason, reported_flags(flags))
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
            settings.constraint_compile_seconds, settings.constraint_compile_memory_mib
        )
        engine = cls(llm, llm.model_config.max_model_len, reason, view, adapters, limits)
        engine.constraints.start()
        return engine

    async def load_adapter(self, name: str, path: Path, lora_id: int | None = None) -> None:
        """Serves `name` from `path` from now on (vLLM loads it at once, so a bad adapter is
        refused here), or raises INVALID_REQUEST naming the field at fault. `lora_id`: the id
        it has elsewhere (an engine replica's adapter has the gateway's id)."""
        from vllm.lora.request import LoRARequest

        self.adapters.check_new(name)
        try:
            check_adapter_path(name, path)
        except ConfigError as e:
            raise invalid(str(e), "lora_path") from e
        adapter = self.adapters.add(name, path, lora_id)
        try:
            await self.llm.add_lora(LoRARequest(name, adapter.lora_id, str(path)))
        except Exception as e:
            self.adapters.remove(name)
            raise invalid(f"The adapter at {path} could not be loaded: {e}", "lora_path") from e

    async def unload_adapter(self, name: str) -> bool:
        """Serves `name` no more (False: it was not loaded). Requests running on it end as
        they would have; new ones are refused naming their field."""
        adapter = self.adapters.remove(name)
        if adapter is None:
            return False
        await self.llm.remove_lora(adapter.lora_id)
        return True

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template: str | None = None,
    ) -> str:
        """The conversation as a prompt, in the model's own chat template (or `chat_template`,
        CHAT_TEMPLATE's), which receives `tools`: ending with the assistant's turn, or
        (`continue_final_message`) inside the last message."""
        if not chat_template and not getattr(self.tokenizer, "chat_template", None):
            raise invalid(
                "This model has no chat template: send `prompt` instead of `messages`", "messages"
            )
        try:
            rendered = self.tokenizer.apply_chat_template(
                list(messages),
                tools=list(tools) if tools is not None else None,
                chat_template=chat_template,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
            )
        except (ValueError, TemplateError) as e:  # no message, or one the template refuses
            raise invalid(f"The chat template cannot render these messages: {e}", "messages") from e
        return str(rendered)

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(token_ids)))

    @property
    def vocabulary(self) -> int:
        """How many token ids the tokenizer knows (0 to this less one)."""
        return len(self.tokenizer)

    def retokenize(self, text: str) -> list[TokenInfo]:
        """`text`'s own tokens, with no log-probability: what is left of a token a stop string
        split (protocols/holdback.py)."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return [TokenInfo(i, str(self.tokenizer.decode([i])), float("nan")) for i in ids]

    def _cut_at_stop(self, step: EngineStep, options: SamplingOptions) -> EngineStep:
        """A sequence that ended at a stop string, with only the tokens of its text: vLLM cuts
        the text but keeps every token id (the stop string's, and one that runs past it)."""
        if not isinstance(step.stop_reason, str):
            return step
        pieces = self._spelled(step, options)
        if "".join(t.text for t in pieces).startswith(step.text):
            parts = [Delta(0, t.text, [t.token_id], [t]) for t in pieces]
            out = described(parts, step.text, self.retokenize)
        else:  # tokens whose text alone is not their text in the sequence (a split character)
            fresh = self.retokenize(step.text)
            out = Delta(0, step.text, [t.token_id for t in fresh], fresh)
        return msgspec.structs.replace(
            step,
            token_ids=out.token_ids,
            tokens=out.tokens if step.tokens is not None else None,
            generated=len(step.token_ids),
        )

    def _spelled(self, step: EngineStep, options: SamplingOptions) -> list[TokenInfo]:
        """Each of the step's tokens with its own text (the engine's, where it gave tokens)."""
        return step.tokens or [
            TokenInfo(i, self._piece(i, options), float("nan")) for i in step.token_ids
        ]

    def _beyond_stop(self, step: EngineStep, options: SamplingOptions) -> str:
        """The text of a last step's tokens past the stop string that ended it (vLLM cuts it)."""
        if not isinstance(step.stop_reason, str):
            return ""
        whole = "".join(t.text for t in self._spelled(step, options))
        return whole[len(step.text) :] if whole.startswith(step.text) else ""

    def _piece(self, token_id: int, options: SamplingOptions) -> str:
        return str(self.tokenizer.decode([token_id], options.skip_special_tokens))

    def unfinished_requests(self) -> int:
        return int(self.llm.get_num_unfinished_requests())

    @property
    def healthy(self) -> bool:
        return not self.llm.errored

    def _token(self, token_id: int, position: Mapping[int, Logprob] | None) -> TokenInfo:
        """A token with its log-probability (NaN where the engine gave none) and alternatives."""
        position = position or {}
        chosen = position.get(token_id)
        special = token_id in self._special
        text = _text(token_id, chosen, self.tokenizer)
        logprob = chosen.logprob if chosen is not None else float("nan")
        if len(position) <= (chosen is not None):  # logprobs=0, the LMI/TGI stream's case
            return TokenInfo(token_id, text, logprob, special=special)
        others = sorted(
            (
                TopToken(tid, _text(tid, lp, self.tokenizer), lp.logprob, tid in self._special)
                for tid, lp in position.items()
                if tid != token_id
            ),
            key=lambda t: -t.logprob,
        )
        return TokenInfo(token_id, text, logprob, tuple(others), special)

    def _step(
        self,
        output: RequestOutput,
        completion: CompletionOutput,
        first: bool,
        constrained: bool = False,
    ) -> EngineStep:
        reason = completion.finish_reason
        if reason in _FAILED:
            raise _engine_failure(reason, constrained)
        step = EngineStep(
            completion.text,
            completion.token_ids,
            output.finished,
            _is_eos(reason, completion.stop_reason),
            reason,
            output.num_cached_tokens or 0,
            stop_reason=completion.stop_reason,
        )
        if completion.logprobs is not None:
            step.tokens = [
                self._token(tid, position)
                for tid, position in zip(completion.token_ids, completion.logprobs, strict=False)
            ]
        if first and output.prompt_logprobs is not None:
            positions = list(output.prompt_logprobs)
            prompt_ids = output.prompt_token_ids or []
            step.prompt_tokens = [
                self._token(tid, positions[i] if i < len(positions) else None)
                for i, tid in enumerate(prompt_ids)
            ]
        return step

    async def stream(
        self,
        token_ids: list[int],
        options: SamplingOptions,
        meter: Meter | None = None,
        priority: int = 0,
        adapter: str | None = None,
    ) -> AsyncGenerator[EngineStep, None]:
        """The steps of one sequence (options.n must be 1), as the engine produces them.

        Each step's text is all of its tokens' text: a stop string that ends the request is
        kept (vLLM would hold back text without its tokens; protocols/holdback.py holds both),
        a stop token's text only when asked for.
        """
        request_id = f"gw-{next(self._ids)}"
        whole = bool(options.stop) and not options.include_stop_str_in_output
        asked = (
            msgspec.structs.replace(options, include_stop_str_in_output=True) if whole else options
        )
        params = _checked_params(asked)
        outputs = self._generate(token_ids, params, request_id, priority, adapter)
        first = True
        constrained = params.structured_outputs is not None
        async with self._tracked(request_id, len(token_ids), meter), aclosing(outputs):
            await self.constraints.check(params)
            async for output in outputs:
                step = self._step(output, output.outputs[0], first, constrained)
                first = False
                if whole and step.is_eos and step.token_ids:
                    step.text = step.text.removesuffix(self._piece(step.token_ids[-1], options))
                if step.finished:
                    step.beyond = self._beyond_stop(step, options)
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
    ) -> list[EngineStep]:
        """Every sequence of a request (options.n of them), each as one final step."""
        request_id = f"gw-{next(self._ids)}"
        params = _checked_params(options, RequestOutputKind.FINAL_ONLY)
        outputs = self._generate(token_ids, params, request_id, priority, adapter)
        constrained = params.structured_outputs is not None
        async with self._tracked(request_id, len(token_ids), meter), aclosing(outputs):
            await self.constraints.check(params)
            async for output in outputs:
                if output.finished:
                    steps = [
                        self._cut_at_stop(self._step(output, c, True, constrained), options)
                        for c in output.outputs
                    ]
                    if meter is not None:
                        tokens = sum(len(s.token_ids) for s in steps)
                        meter.step(tokens, steps[0].cached_tokens, True)
                    return steps
        raise _engine_failure("no output")

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
            failure = _translated(e)
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
    ) -> list[EngineStep]:
        """Beam search as transformers does it (gateway/engine/beams.py), run to the end: every
        beam, best first (what it generated counts toward a caller's tokens, whichever beams
        the protocol answers with), each step's beams one engine request each, each token with
        the log-probability the model gave it (no alternatives).
        """
        room = self.max_model_len - len(token_ids)
        sample = options.do_sample and options.temperature > 0
        request_id = f"gw-beam-{next(self._ids)}"
        # Resolved once: each step is an engine request, and the adapter may be unloaded
        # (its name then unknown) while the search runs.
        lora = self.adapters.lora_request(adapter)
        async with self._tracked(request_id, len(token_ids), meter):
            beams = await beam_search(
                token_ids,
                partial(self._next_tokens, request_id, priority, lora),
                num_beams=options.num_beams,
                max_new_tokens=min(options.max_new_tokens, room),
                eos_token_ids=frozenset() if options.ignore_eos else self.eos_token_ids,
                length_penalty=options.length_penalty,
                early_stopping=options.early_stopping,
                temperature=options.temperature if sample else None,
                seed=options.seed,
            )
        if meter is not None:
            meter.step(sum(len(b.token_ids) for b in beams), 0, True)
        return [
            EngineStep(
                str(self.tokenizer.decode(b.token_ids, options.skip_special_tokens)),
                b.token_ids,
                True,
                b.ended_at_eos,
                "stop" if b.ended_at_eos else "length",
                0,
                [
                    msgspec.structs.replace(self._token(t, None), logprob=logprob)
                    for t, logprob in zip(b.token_ids, b.logprobs, strict=True)
                ],
            )
            for b in beams
        ]

    async def _next_tokens(
        self,
        request_id: str,
        priority: int,
        lora: LoRARequest | None,
        sequences: list[list[int]],
        count: int,
    ) -> list[dict[int, float]]:
        """Each sequence's `count` likeliest next tokens, with their log-probabilities."""
        params = SamplingParams(
            max_tokens=1, temperature=0.0, logprobs=min(count, 20), detokenize=False
        )

        async def one(i: int, sequence: list[int]) -> dict[int, float]:
            name = f"{request_id}-{i}"
            outputs = self.llm.generate(
                tokens_input(sequence), params, name, lora_request=lora, priority=priority
            )
            async with aclosing(outputs):
                async for output in outputs:
                    if output.finished:
                        completion = output.outputs[0]
                        if completion.finish_reason in _FAILED or not completion.logprobs:
                            raise _engine_failure(completion.finish_reason)
                        return {t: lp.logprob for t, lp in completion.logprobs[0].items()}
            raise _engine_failure("no output")

        return list(await asyncio.gather(*(one(i, s) for i, s in enumerate(sequences))))

    def on_death(self, callback: Callable[[str], None]) -> None:
        """Calls `callback(reason)` once vLLM gives this engine up, unless `shutdown` did.

        vLLM's own monitor thread waits on the engine-core process; when it exits, the monitor
        marks the client dead and closes its sockets, and the output handler task fails every
        running request with `EngineDeadError` and ends. An engine-core that reports its own
        fatal error ends that task the same way. Its end is the one event for both. Must be
        called on the event loop the engine serves.
        """
        # AsyncLLM starts the handler with the first request, or at once when it is built on
        # a running loop; Engine.start builds it in a worker thread, so start it here.
        handler = start_output_handler(self.llm)

        def ended(_: object) -> None:
            if not self._closing:
                callback(self.death_reason())

        handler.add_done_callback(ended)

    def core_pids(self) -> list[int]:
        return [int(p.pid) for p in core_processes(self.llm) if p.pid is not None]

    def death_reason(self) -> str:
        exited = [
            f"{p.name} (pid {p.pid}) exited with code {p.exitcode}"
            for p in core_processes(self.llm)
            if p.exitcode is not None
        ]
        return "; ".join(exited) or "vLLM's output handler stopped"

    def shutdown(self) -> None:
        """Stops the engine-core process, or cleans up after one that died (twice is harmless)."""
        if self._closing:
            return
        self._closing = True
        self.constraints.close()
        self.llm.shutdown()
