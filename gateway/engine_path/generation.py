"""The one engine path: every protocol's prompts go through `GenerationService.generate`.

`generate` takes one `GenerationRequest` and yields its events. It applies, once for every
protocol: the bounds on its sequences and the caller's limits (each sequence counts), the size
limits on its output constraint (protocols/constraint_budget.py), the in-flight request_id
check, the ready engine, tokenizing (off the event loop for long prompts) or chat rendering,
truncation, the context check, continuation from a history, admission, metrics, the error
mapping (every failure is a `Failed` event), and abort on cancel (closing the generator closes
the engine stream, which aborts the engine request).
Batches of prompts and continuation keys (gateway/engine_path/batch.py) and the control
session's actions (gateway/engine_path/control_session.py) are layers on top of it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing, nullcontext
from contextvars import ContextVar

from msgspec.structs import replace

from gateway.config.priorities import PriorityClasses
from gateway.config.settings import Settings
from gateway.edge.caller import current_caller
from gateway.edge.limits import Limiter, RateLimited
from gateway.engine.contract import Engine
from gateway.engine.holder import EngineHolder
from gateway.engine.outputs import EngineStep
from gateway.engine_path.admission import Admission
from gateway.engine_path.bounded_tokens import longest_token
from gateway.engine_path.deadlines import SHUTTING_DOWN, Deadlines
from gateway.engine_path.metrics import GatewayMetrics, StreamMeter
from gateway.engine_path.sequences import SequenceBounds, checked_sequences
from gateway.engine_path.traced_prompt import TracedPrompt, traced_prompt
from gateway.observability.tracing import child
from protocols.constraint_budget import ConstraintBudget, check_options
from protocols.constraints import is_constrained, placed
from protocols.errors import ErrorKind, GenerationError, invalid
from protocols.events import (
    Delta,
    Event,
    Failed,
    Finished,
    GeneratedSequence,
    History,
    Initialized,
    Queued,
    Started,
    token_array,
)
from protocols.generation import GenerationRequest
from protocols.names import Protocol
from protocols.stop_strings import Holdback, stop_string_of

log = logging.getLogger(__name__)
# The priority class of the prompt waiting for its engine, for a model loaded on demand
# (gateway/engine_path/residency.py): an interactive prompt's load goes before a bulk one's.
LOAD_PRIORITY: ContextVar[int] = ContextVar("load_priority", default=0)
# Tokenizing costs about a microsecond a character: past this, do it in a worker thread.
_TOKENIZE_INLINE_CHARS = 4096


class GenerationService:
    def __init__(
        self,
        holder: EngineHolder,
        admission: Admission,
        metrics: GatewayMetrics | None = None,
        deadlines: Deadlines | None = None,
        classes: PriorityClasses | None = None,
        bounds: SequenceBounds | None = None,
        chat_template: str | None = None,
        budget: ConstraintBudget | None = None,
        limiter: Limiter | None = None,
        *,
        watched: bool = True,
        model: str | None = None,
    ) -> None:
        """`limiter`: the per-key limits, shared by every model's service; `watched`: this
        service's admission and scheduler are /metrics' gauges (the default model's)."""
        self.holder = holder
        self.model = model  # its requests counted by model too (gateway_model_requests)
        self.budget = budget or ConstraintBudget()
        self.chat_template = chat_template  # CHAT_TEMPLATE; None: the model's own
        self.bounds = bounds or SequenceBounds.of(Settings())
        self.admission = admission
        self.metrics = metrics or GatewayMetrics()
        if watched:
            self.metrics.watch_admission(admission)
            self.metrics.watch_scheduler(lambda: holder.engine.scheduler if holder.engine else None)
        self.classes = classes or PriorityClasses({})
        self.limiter = limiter if limiter is not None else Limiter()  # an empty one is falsy
        self.deadlines = deadlines or Deadlines(0.0)
        self._in_flight: set[tuple[str, str]] = set()
        # Prompts between their `generate` and their end: a model with any is never unloaded
        self.active = 0
        self.on_idle: Callable[[], None] | None = None  # told when `active` falls to 0

    def adapter_of(self, request: GenerationRequest) -> str | None:
        """The adapter `request` generates with: None for the base model, however named."""
        engine = self.holder.engine
        return engine.adapters.resolved(request.adapter) if engine else request.adapter

    def is_generating(self, request_id: str) -> bool:
        return (current_caller().owner, request_id) in self._in_flight

    async def generate(
        self, request: GenerationRequest, protocol: Protocol
    ) -> AsyncGenerator[Event, None]:
        """Queued, Started, Initialized, Deltas (when streamed), then one Finished or Failed.

        The prompt is checked before it queues for admission; a request that fails before it
        starts yields only its Failed. Each prompt is counted in when it comes and out with its
        end (`/metrics`): finished, failed (its error kind), or client_gone when its consumer
        stopped listening before the end.
        """
        caller = current_caller()
        ending = self.metrics.prompt_accepted(protocol)
        generated = 0
        traced = traced_prompt(request, protocol, self.model, caller.name)
        try:
            sequences = checked_sequences(request, self.bounds, caller.limits.concurrent)
            check_options(request.options, request.constraint_field, self.budget)
            self.limiter.acquire(caller.id, caller.limits, sequences)
        except GenerationError as e:
            if isinstance(e, RateLimited):
                caller.retry_after = e.retry_after
            ending.end(e.kind.value)
            if traced is not None:
                traced.failed(e.kind, e.message)
                traced.end()
            yield _failed(request.index, e)
            return
        self.active += 1
        try:
            events = self._events(request, protocol, caller.id, caller.owner, traced)
            # Each generator closed explicitly, innermost first: a consumer that leaves aborts
            # the engine request at once, never when the garbage collector gets to it.
            bounded = self.deadlines.within(events, request.index)
            async with aclosing(events), aclosing(bounded):
                async for event in bounded:
                    if isinstance(event, Delta):
                        generated += len(event.token_ids)
                    elif isinstance(event, Finished):
                        ending.end("finished")
                        generated = sum(s.generated_tokens for s in event.sequences)
                    elif isinstance(event, Failed):
                        ending.end(event.kind.value)
                    if traced is not None:
                        traced.saw(event)
                    yield event
        finally:
            if traced is not None:
                traced.end()
            ending.end("client_gone")  # when neither came: the consumer left first
            self.limiter.release(caller.id, caller.limits, generated, sequences)
            self.active -= 1
            if not self.active and self.on_idle is not None:
                self.on_idle()

    async def _events(
        self,
        request: GenerationRequest,
        protocol: Protocol,
        caller: str,
        owner: str,
        traced: TracedPrompt | None = None,
    ) -> AsyncGenerator[Event, None]:
        request_id = request.request_id
        in_flight = (owner, request_id) if request_id is not None else None
        if in_flight is not None:
            if in_flight in self._in_flight:
                yield _failed(request.index, _duplicate(request_id or ""))
                return
            self._in_flight.add(in_flight)
        try:
            if self.deadlines.draining:
                raise GenerationError(ErrorKind.ENGINE_UNAVAILABLE, SHUTTING_DOWN)
            span = traced.span if traced is not None else None
            priority = self.classes.of(protocol, request.priority)
            waiting = LOAD_PRIORITY.set(priority)
            loading = self.holder.engine is None and span is not None  # loading, or to load
            try:
                with child(span, "llm_gateway.model_load") if loading else nullcontext():
                    engine = await self.holder.wait()
            finally:
                LOAD_PRIORITY.reset(waiting)
            adapter = engine.adapters.check(request.adapter, request.adapter_field)
            if adapter != request.adapter:  # the base model, by its name
                request = replace(request, adapter=adapter)
            history = await _history(engine, request, self.chat_template)
            yield Queued(request.index, history.token_ids)
            queued = time.perf_counter()
            async with self.admission.slot(priority, caller, span):
                self.metrics.queue_time.labels(str(priority)).observe(time.perf_counter() - queued)
                yield Started(request.index)
                meter = self.metrics.meter(protocol, priority, request.adapter, self.model)
                meter.span = span
                steps = _engine_events(engine, request, history, meter, priority, caller)
                async with aclosing(steps):
                    async for event in steps:
                        yield event
        except GenerationError as e:
            yield _failed(request.index, placed(e, request.constraint_field))
        except Exception as e:
            log.exception("generation failed (%s, request_id %r)", protocol, request_id)
            error = GenerationError(ErrorKind.ENGINE_ERROR, f"Generation failed: {e}")
            yield _failed(request.index, error)
        finally:
            if in_flight is not None:
                self._in_flight.discard(in_flight)


async def _history(
    engine: Engine, request: GenerationRequest, chat_template: str | None = None
) -> History:
    """The sequence to submit: the request's history, or its prompt tokenized, within context."""
    history = request.history
    if history is None:
        prompt = request.prompt
        if request.messages is not None:
            prompt = engine.render_chat(
                request.messages, tools=request.tools, chat_template=chat_template
            )
        if not prompt:
            raise invalid(
                "The prompt must not be empty (a known request_id may continue with an empty "
                "prompt)",
                request.prompt_field,
            )
        longest = _longest_token(engine)
        if request.truncate is not None:
            # Only the tail is kept: tokenize enough of it that the cut falls well before it.
            prompt = prompt[-(request.truncate + 16) * longest :]
        elif len(prompt) > engine.max_model_len * longest:
            # OpenAI's and vLLM's wording, and "prompt is too long": litellm and
            # langchain-openai recognise an overflow by these words, not by its code.
            raise GenerationError(
                ErrorKind.CONTEXT_LENGTH_EXCEEDED,
                f"This model's maximum context length is {engine.max_model_len} tokens. "
                f"However, your prompt is too long: it contains {len(prompt)} characters (more "
                f"than {engine.max_model_len * longest} characters, which is the upper bound "
                f"for {engine.max_model_len} input tokens). Please reduce the length of the "
                "input prompt.",
                request.prompt_field,
            )
        ids = await tokenized(prompt, engine.encode)
        if request.truncate is not None:
            ids = ids[-request.truncate :]
        history = History(token_array(ids), prompt)
    length = len(history.token_ids)
    if length >= engine.max_model_len:
        raise GenerationError(
            ErrorKind.CONTEXT_LENGTH_EXCEEDED,
            f"This model's maximum context length is {engine.max_model_len} tokens. However, "
            f"your prompt is too long: it contains {length} input tokens, which leaves no room "
            "for output tokens. Please reduce the length of the input prompt.",
            request.prompt_field,
        )
    return history


async def tokenized(text: str, encode: Callable[[str], list[int]]) -> list[int]:
    """`encode(text)`, in a worker thread when the text is long, so the event loop serves on."""
    if len(text) > _TOKENIZE_INLINE_CHARS:
        return await asyncio.to_thread(encode, text)
    return encode(text)


def _longest_token(engine: Engine) -> int:
    """The most characters one token stands for: a prompt longer than the context times this
    cannot fit, and is refused before the tokenizer spends seconds on megabytes of it."""
    return longest_token(engine.tokenizer)


async def _engine_events(
    engine: Engine,
    request: GenerationRequest,
    history: History,
    meter: StreamMeter,
    priority: int,
    caller: str,
) -> AsyncGenerator[Event, None]:
    options, index = request.options, request.index
    room = engine.max_model_len - len(history.token_ids)
    if options.max_new_tokens > room:  # the engine stops at the context's end anyway
        options = replace(options, max_new_tokens=room)
    started = time.perf_counter()
    token_ids = history.token_ids.tolist()
    if history.ended_at_eos:
        # The sequence is over: continuing it generates nothing (docs/PROTOCOLS.md).
        yield Initialized(index, history.text)
        yield _finished(request, history, [EngineStep("", [], True, True, "stop", 0)], started)
        return
    if options.num_beams > 1 and is_constrained(options):
        field = request.constraint_field or "num_beams"
        # Beam search (gateway/engine/beams.py) scores next tokens with no grammar.
        raise invalid(f"An output constraint cannot be used with beam search - at `{field}`", field)
    if options.num_beams > 1 or options.n > 1 or not request.stream:
        run = engine.beam_search if options.num_beams > 1 else engine.complete
        steps = await run(
            token_ids, options, meter, priority, adapter=request.adapter, caller=caller
        )
        yield Initialized(index, history.text)
        yield _finished(request, history, steps, started)
        return
    holdback = request.holdback or Holdback()
    holdback.begin(options.stop, options.include_stop_str_in_output, engine.retokenize)
    first: EngineStep | None = None
    last: EngineStep | None = None
    texts: list[str] = []
    new_ids: list[int] = []  # the ids of the text sent: none of a cut stop string's
    generated = 0
    stream = engine.stream(
        token_ids, options, meter, priority, adapter=request.adapter, caller=caller
    )
    async with aclosing(stream):
        async for step in stream:
            if first is None:
                first = step
                yield Initialized(index, history.text)
            last = step
            generated += len(step.token_ids)
            if step.finished:
                reason = step.finish_reason or "length"
                piece = Delta(index, step.text, list(step.token_ids), step.tokens, reason)
                stop_string = stop_string_of(step.stop_reason)
                out: Delta | None = holdback.finish(piece, stop_string, step.beyond)
            else:
                out = holdback.push(Delta(index, step.text, list(step.token_ids), step.tokens))
            if out is not None:
                texts.append(out.text)
                new_ids.extend(out.token_ids)
                yield out
            if holdback.stopped_at is not None:
                # The held text completed a stop string begun before this request: end it here
                # (leaving the loop closes the engine stream, which aborts the engine request).
                last = replace(
                    step, finished=True, finish_reason="stop", stop_reason=holdback.stopped_at
                )
                break
    if first is None or last is None or not last.finished:
        raise GenerationError(ErrorKind.ENGINE_ERROR, "The engine ended the request unfinished")
    # The steps as one: the end from the last, the prefill figures from the first.
    whole = replace(
        last,
        text="".join(texts),
        token_ids=new_ids,
        generated=generated,
        tokens=None,
        cached_tokens=first.cached_tokens,
        prompt_tokens=first.prompt_tokens,
    )
    yield _finished(request, history, [whole], started)


def _finished(
    request: GenerationRequest, history: History, steps: list[EngineStep], started: float
) -> Finished:
    """The end of a prompt whose sequences (all their steps as one each) followed `history`.

    The first sequence continues the history.
    """
    step = steps[0]
    is_eos = history.ended_at_eos or step.is_eos
    ids = token_array(step.token_ids)
    after = History(history.token_ids + ids, history.text + step.text, is_eos, request.adapter)
    return Finished(
        index=request.index,
        history=after,
        prompt_tokens=len(history.token_ids),
        execution_time=time.perf_counter() - started,
        sequences=[
            GeneratedSequence(
                s.text,
                len(s.token_ids) if s.generated is None else s.generated,
                s.finish_reason or "length",
                s.stop_reason,
                s.tokens,
            )
            for s in steps
        ],
        prefill=step.prompt_tokens,
        cached_tokens=step.cached_tokens,
    )


def _duplicate(request_id: str) -> GenerationError:
    return GenerationError(
        ErrorKind.DUPLICATE_REQUEST_ID,
        f"request_id {request_id!r} is already generating; wait for its end or use another id",
        "request_id",
    )


def _failed(index: int, error: GenerationError) -> Failed:
    return Failed(index, error.kind, error.message, error.field)
