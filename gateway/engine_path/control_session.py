"""One client's conversation on the control protocol (control-ws.md), transport-free.

A session holds at most one generation. Its engine request runs as a task; `stop`, `pause`,
`modify` and `regenerate` cancel that task (which aborts the engine request) and keep the
generation's token history, so `resume` and `modify` resubmit it and vLLM's prefix cache
serves the tokens already computed. Messages go out through `send`. With a `Replay`, a session
whose connection dropped can be detached (its generation goes on for nobody) and attached to
another connection, which first gets what it missed (docs/CONTROL.md, "Reattaching").
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from contextlib import aclosing
from typing import Literal

import msgspec

from gateway.config.settings import Settings
from gateway.edge.caller import current_caller
from gateway.edge.feedback_limits import FeedbackLimits
from gateway.engine_path.chat_models import ChatModels
from gateway.engine_path.replay import Replay
from gateway.observability.tracing import Trace, enter_trace, finish, mark, message_trace
from gateway.stores.feedback import FeedbackRecord, FeedbackStore, FeedbackStoreFull
from protocols.control import (
    CANCELLED,
    LOGPROB_ALTERNATIVES,
    ClientMessage,
    Completion,
    CompletionTiming,
    Config,
    Control,
    Feedback,
    Init,
    LogprobEntry,
    ModelInfo,
    Reattach,
    ServerMessage,
    Status,
    Token,
    TokenTiming,
    Usage,
    apply_parameters,
    check_prompt,
    error_message,
)
from protocols.errors import GenerationError, invalid
from protocols.events import Delta, Failed, Finished, History, Initialized, Queued, token_array
from protocols.generation import GenerationRequest, SamplingOptions
from protocols.names import Protocol
from protocols.stop_strings import Holdback

log = logging.getLogger(__name__)
State = Literal["new", "generating", "paused", "done"]


class _Generation:
    """The token history and text of one generation, as the client has seen it."""

    def __init__(self, request_id: str, config: Config, options: SamplingOptions) -> None:
        self.request_id = request_id
        self.announced_id: str | None = None  # request_id, once its `init` went out
        self.config = config
        self.options = options
        self.token_ids: list[int] = []
        self.prompt_length = 0
        self.text = ""
        self.holdback = Holdback()  # generated tokens whose text is not out yet
        self.started = time.perf_counter()
        self.first_token_at: float | None = None
        self.last_token_at = self.started
        self.finish_reason: str | None = None
        self.end_announced = False  # a token message said `finished`
        self.trace: Trace | None = None  # its own, or the REST request's (tracing on)

    @property
    def sequence(self) -> list[int]:
        """Every token so far, the held-back ones too."""
        return self.token_ids + self.holdback.held_ids

    @property
    def completion_tokens(self) -> int:
        return len(self.sequence) - self.prompt_length


class ControlSession:
    def __init__(
        self,
        settings: Settings,
        chats: ChatModels,
        feedback: FeedbackStore,
        feedback_limits: FeedbackLimits,
        send: Callable[[ServerMessage], None],
        protocol: Protocol = Protocol.CONTROL,
        replay: Replay | None = None,
        task_of: Callable[[str], str | None] = lambda _name: None,
        asked: str | None = None,
    ) -> None:
        """`asked`: the model the connection named (X-Model, a `model` query parameter), for
        a `config` that names none."""
        self.settings = settings
        self._chats = chats
        self._asked = asked
        self.service = chats.default.service  # a `config`'s model's, once one came
        self.feedback = feedback
        self.feedback_limits = feedback_limits
        self.protocol = protocol
        self._deliver: Callable[[ServerMessage], None] | None = send  # None: detached
        self.replay = replay
        self._task_of = task_of  # what another model the gateway serves does (the registry's)
        # Each message goes out through `send`; without a replay (REATTACH_SECONDS=0) straight
        # to the connection, nothing kept and nothing checked per token.
        self.send: Callable[[ServerMessage], None] = send if replay is None else self._kept
        self.state: State = "new"
        self.model = chats.default.name
        self._config: Config | None = None
        self._options: SamplingOptions | None = None
        self._gen: _Generation | None = None
        self._task: asyncio.Task[None] | None = None
        self._pause_timer: asyncio.Task[None] | None = None
        self._last_request_id: str | None = None

    # --- client messages ---------------------------------------------------------------------

    async def handle(self, message: ClientMessage) -> None:
        try:
            match message:
                case Config():
                    self._configure(message)
                case Control(action="stop"):
                    await self._stop()
                case Control(action="pause"):
                    await self._pause()
                case Control(action="resume"):
                    self._resume()
                case Control(action="modify"):
                    await self._modify(message)
                case Control(action="regenerate"):
                    await self._regenerate()
                case Feedback():
                    await self._feedback(message)
                case Reattach():  # taken by the route when REATTACH_SECONDS is on
                    raise invalid(
                        "Reattaching is off on this server (REATTACH_SECONDS=0)", "$.type"
                    )
        except GenerationError as e:
            self.refuse(e)

    def _kept(self, message: ServerMessage) -> None:
        """`send` with a replay: kept for a client that reattaches, then to the connection
        attached, if one is."""
        assert self.replay is not None
        self.replay.keep(message, ended=self.state == "done")
        if self._deliver is not None:
            self._deliver(message)

    @property
    def request_id(self) -> str | None:
        """The generation a client may reattach to: announced, and running or paused."""
        if self.state not in ("generating", "paused") or self._gen is None:
            return None
        return self._gen.announced_id

    def detach(self) -> None:
        """The connection dropped: the generation goes on, its messages only kept."""
        assert self.replay is not None  # without one, messages would go to the old connection
        self._deliver = None

    def attach(self, send: Callable[[ServerMessage], None], received: int) -> None:
        """Another connection takes the generation over: a `status` (`reattached`), the token
        messages after the first `received`, the terminal message if it ended, then the rest
        as it comes. Nothing can come between the missed messages and the new ones."""
        assert self.replay is not None and self._gen is not None
        if received > self.replay.token_messages:
            raise invalid(
                f"`received` is {received}, but the generation has sent "
                f"{self.replay.token_messages} token messages",
                "$.received",
            )
        gen = self._gen
        done = f"reattached after {received} of {self.replay.token_messages} token messages"
        send(self._status("reattached", gen, done))
        for message in self.replay.since(received):
            send(message)
        self._deliver = send
        mark(gen.trace, "llm_gateway.control.reattach")

    def refuse(self, error: GenerationError) -> None:
        """An error about a client message (one that could not be decoded too): it names the
        latest generation an `init` announced, as every error after it does."""
        self.send(error_message(error, self._current_id()))

    async def close(self) -> None:
        """The client left: stop everything (the engine request is aborted)."""
        await self._cancel()
        if self._gen is not None:
            finish(self._gen.trace)

    async def abort(self, why: str) -> None:
        """The connection cannot go on (its client does not read): stop everything, and a
        generation that was running or paused ends with a `memory_pressure` error, its
        terminal message."""
        running = self.state in ("generating", "paused")
        await self._cancel()
        if running and self._gen is not None:
            finish(self._gen.trace)
            self.state = "done"
            message = error_message(
                invalid(why), self._gen.announced_id, recoverable=False, recovery_action="reconnect"
            )
            self.send(msgspec.structs.replace(message, error="memory_pressure"))

    def _generation(self, states: tuple[State, ...], refusal: str) -> _Generation:
        if self.state not in states or self._gen is None:
            raise invalid(refusal)
        return self._gen

    def _current_id(self) -> str | None:
        """The latest generation an `init` announced."""
        return self._last_request_id

    def _configure(self, config: Config) -> None:
        if self.state in ("generating", "paused"):
            raise invalid("A generation is in progress: send `stop` before a new `config`")
        check_prompt(config)
        asked = config.model if config.model is not None else self._asked
        chosen = self._chats.find(asked)
        if chosen is None:
            default = self._chats.default.name
            if self._task_of(asked or "") == "embed":
                raise invalid(
                    f"Model {asked!r} embeds; it does not generate: ask {default!r}", "$.model"
                )
            served = ", ".join(repr(name) for name in self._chats.names())
            raise invalid(
                f"Model {asked!r} is not served here; this server serves {served}", "$.model"
            )
        chosen.touch()
        self.service, self.model = chosen.service, chosen.name
        options = apply_parameters(
            self.settings.generation, config.parameters, self.settings.max_stop_sequences
        )
        if config.options.include_logprobs:
            options = msgspec.structs.replace(options, logprobs=LOGPROB_ALTERNATIVES)
        self._config, self._options = config, options
        self._start()

    def _start(self) -> None:
        assert self._config is not None and self._options is not None
        gen = _Generation(f"gen_{uuid.uuid4().hex[:12]}", self._config, self._options)
        gen.trace = message_trace(self.protocol.value)
        self._gen = gen
        self.state = "generating"
        self._task = asyncio.create_task(self._drive(gen))

    async def _stop(self) -> None:
        gen = self._generation(("generating", "paused"), "There is no generation to stop")
        await self._interrupt()
        self._complete(gen, CANCELLED)

    async def _pause(self) -> None:
        gen = self._generation(("generating",), "`pause` needs a running generation")
        await self._interrupt()
        self.state = "paused"
        mark(gen.trace, "llm_gateway.control.pause")
        self._pause_timer = asyncio.create_task(self._expire_pause(gen))
        self.send(self._status("paused", gen, f"paused after {gen.completion_tokens} tokens"))

    def _resume(self) -> None:
        gen = self._generation(("paused",), "`resume` needs a paused generation")
        self._cancel_pause_timer()
        self.state = "generating"
        mark(gen.trace, "llm_gateway.control.resume")
        self.send(self._status("resumed", gen, f"resuming after {gen.completion_tokens} tokens"))
        self._task = asyncio.create_task(self._drive(gen))

    async def _modify(self, control: Control) -> None:
        if control.parameters is None:
            raise invalid("`modify` needs `parameters`", "$.parameters")
        gen = self._generation(
            ("generating", "paused"), "`modify` needs a running or paused generation"
        )
        options = apply_parameters(
            gen.options, control.parameters, self.settings.max_stop_sequences
        )
        running = self.state == "generating"
        if running:
            await self._interrupt()
        gen.options = self._options = options
        mark(gen.trace, "llm_gateway.control.modify")
        self.send(self._status("modified", gen, "parameters changed; the rest follows them"))
        if running:
            self.state = "generating"
            self._task = asyncio.create_task(self._drive(gen))

    async def _regenerate(self) -> None:
        if self._config is None:
            raise invalid("`regenerate` needs a `config` first")
        abandoned = self._gen if self.state in ("generating", "paused") else None
        await self._cancel()
        if abandoned is not None and abandoned.announced_id and self.state != "done":
            self._complete(abandoned, CANCELLED)  # every init gets exactly one completion
        self._start()

    async def _feedback(self, feedback: Feedback) -> None:
        request_id = self._current_id()
        if request_id is None:
            raise invalid("There is no generation to give feedback on yet")
        caller = current_caller()
        self.feedback_limits.admit(caller.id, feedback.text)
        record = FeedbackRecord(
            request_id,
            self.model,
            feedback.rating,
            feedback.text,
            feedback.position,
            time.time(),
            caller.name or caller.id,  # without keys, the client's address
            caller.owner or None,
        )
        try:
            await self.feedback.add(record)
        except FeedbackStoreFull as e:
            refusal = error_message(e, request_id, recovery_action="none")
            self.send(msgspec.structs.replace(refusal, error="storage_full"))
            return
        self.send(Status("feedback_recorded", 100.0, f"feedback on {request_id} saved", 0.0))

    # --- the generation task ------------------------------------------------------------------

    def _request(self, gen: _Generation) -> GenerationRequest:
        """The config's prompt the first time; then the history so far, for what remains."""
        config = gen.config
        if not gen.prompt_length:
            messages = None
            if not isinstance(config.prompt, str):
                messages = tuple(msgspec.structs.asdict(m) for m in config.messages or ())
            prompt = config.prompt if isinstance(config.prompt, str) else ""
            return GenerationRequest(
                options=gen.options,
                prompt=prompt,
                messages=messages,
                prompt_field="$.prompt",
                holdback=gen.holdback,
                adapter=config.model,  # the served model's name, a LoRA adapter's, or none
                adapter_field="$.model",
            )
        remaining = max(gen.options.max_new_tokens - gen.completion_tokens, 1)
        options = msgspec.structs.replace(
            gen.options, max_new_tokens=remaining, min_tokens=min(gen.options.min_tokens, remaining)
        )
        history = History(token_array(gen.sequence), "")
        return GenerationRequest(
            options=options,
            history=history,
            prompt_field="$.prompt",
            holdback=gen.holdback,
            adapter=config.model,
            adapter_field="$.model",
        )

    async def _drive(self, gen: _Generation) -> None:
        """Generate (on): `init` the first time the prompt reaches the engine, then tokens."""
        enter_trace(gen.trace)  # the prompts' spans go on the generation's trace
        if gen.prompt_length and gen.completion_tokens >= gen.options.max_new_tokens:
            self._complete(gen, gen.finish_reason or "length")
            return
        events = self.service.generate(self._request(gen), self.protocol)
        async with aclosing(events):
            async for event in events:
                match event:
                    case Queued(token_ids=token_ids) if not gen.prompt_length:
                        gen.token_ids = list(token_ids)
                        gen.prompt_length = len(gen.token_ids)
                        gen.announced_id = self._last_request_id = gen.request_id
                        info = ModelInfo(max_tokens=self._max_model_len())
                        model = gen.config.model or self.model
                        self.send(Init(gen.request_id, model, info))
                    case Initialized(prompt_text=text) if gen.config.options.echo_prompt:
                        if not gen.text:
                            gen.text = text
                    case Delta():
                        self._on_delta(gen, event)
                    case Finished(sequences=[new, *_]):
                        gen.finish_reason = new.finish_reason
                    case Failed():
                        self._fail(gen, _rooted(event.error()))
                        return
        self._complete(gen, gen.finish_reason or "length")

    def _max_model_len(self) -> int:
        engine = self.service.holder.engine
        return engine.max_model_len if engine is not None else 0

    def _on_delta(self, gen: _Generation, delta: Delta) -> None:
        gen.token_ids.extend(delta.token_ids)
        if not delta.text and delta.finish_reason is None:
            return
        now = time.perf_counter()
        gen.text += delta.text
        if gen.first_token_at is None and delta.text:
            gen.first_token_at = now
        if gen.config.options.stream:
            self.send(self._token(gen, delta, now))
        gen.last_token_at = now

    def _token(self, gen: _Generation, delta: Delta, now: float) -> Token:
        """A token message; the one of the step that ended the generation says so, even when
        that step has no text to send (the end-of-sequence token's is not sent)."""
        options = gen.config.options
        last = delta.finish_reason is not None
        gen.end_announced = last
        message = Token(delta.text, gen.text, delta.finish_reason, last)
        if options.include_token_ids and delta.token_ids:
            message.token_id = delta.token_ids[-1]
            if len(delta.token_ids) > 1:
                message.token_ids = delta.token_ids
        if options.include_logprobs and delta.tokens:
            info = delta.tokens[-1]
            message.logprobs = [LogprobEntry(info.text, info.logprob)] + [
                LogprobEntry(alt.text, alt.logprob) for alt in info.alternatives
            ]
        if options.include_timing:
            message.timing = TokenTiming(_ms(now - gen.last_token_at), _ms(now - gen.started))
        return message

    def _complete(self, gen: _Generation, reason: str) -> None:
        self._cancel_pause_timer()
        if gen.config.options.stream and gen.announced_id and not gen.end_announced:
            # It ended with no engine step to report (stop, regenerate, a lowered max_tokens):
            # the last token message still says how.
            self.send(self._token(gen, Delta(0, "", [], None, reason), time.perf_counter()))
        usage = Usage(gen.prompt_length, gen.completion_tokens, len(gen.sequence))
        message = Completion(gen.text, reason, usage, gen.announced_id)
        if gen.config.options.include_timing:
            first = None if gen.first_token_at is None else _ms(gen.first_token_at - gen.started)
            message.timing = CompletionTiming(first, _ms(time.perf_counter() - gen.started))
        finish(gen.trace, (gen.prompt_length, gen.completion_tokens), reason)
        self.state = "done"
        self.send(message)

    def _fail(self, gen: _Generation, error: GenerationError) -> None:
        self._cancel_pause_timer()
        finish(gen.trace)
        self.state = "done"
        self.send(error_message(error, gen.announced_id))

    async def _expire_pause(self, gen: _Generation) -> None:
        await asyncio.sleep(self.settings.pause_timeout_seconds)
        if self._gen is gen and self.state == "paused":
            finish(gen.trace)
            self.state = "done"
            expired = invalid("Paused for longer than the pause timeout; the generation ended")
            message = error_message(expired, gen.request_id, recovery_action="regenerate")
            self.send(msgspec.structs.replace(message, error="timeout"))

    # --- helpers ------------------------------------------------------------------------------

    async def _cancel(self) -> None:
        self._cancel_pause_timer()
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _interrupt(self) -> None:
        await self._cancel()
        if self.state == "done":  # it completed while the control was on its way
            raise invalid("The generation has already completed")

    def _cancel_pause_timer(self) -> None:
        if self._pause_timer is not None:
            self._pause_timer.cancel()
            self._pause_timer = None

    def _status(self, operation: str, gen: _Generation, message: str) -> Status:
        done, limit = gen.completion_tokens, gen.options.max_new_tokens
        progress = round(min(100.0 * done / limit, 100.0), 1)
        eta = None  # from the pace of the tokens so far, once there are two
        if done >= 2 and gen.first_token_at is not None:
            pace = (gen.last_token_at - gen.first_token_at) / (done - 1)
            eta = round(max(limit - done, 0) * pace, 2)
        return Status(operation, progress, message, eta)


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 2)


def _rooted(error: GenerationError) -> GenerationError:
    """Service errors name the prompt's field relative to it: root it at the config."""
    if error.field is None or error.field.startswith("$"):
        return error
    return GenerationError(error.kind, error.message, f"$.{error.field}")
