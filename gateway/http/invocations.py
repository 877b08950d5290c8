"""An `/invocations` answer, prepared: the LMI schema (lmi-invocations.md), served by LMI's
routes (gateway/routes/lmi.py) and, reframed, by the SageMaker runtime's
(gateway/routes/sagemaker.py).

A body with `messages` is a chat-completions request (DJL Serving's rule) and answers as
/v1/chat/completions does (gateway/http/chat.py), its stream as JSON lines of
`chat.completion.chunk` (DJL's `jsonlines_chat` framing) unless SSE is asked for. A stream
commits to 200 only once its first token exists, so errors before that keep their 4xx/5xx
status. Whatever way a response ends, its generation is closed, which aborts the engine
requests.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from functools import partial

from starlette.requests import Request

from gateway.engine_path.chat_model import ChatModel
from gateway.http.chat import prepare
from gateway.http.model_choice import ModelRefused, asked_model, chat_model_for
from gateway.http.openapi import TEXT, Events
from gateway.http.prepared import CLIENT_GONE, JSON, SSE, Chunk, Chunks, Prepared, Whole, streamed
from gateway.http.streaming import Step, chained, has_output, until_disconnect
from gateway.state import gateway_of
from protocols.errors import ErrorKind, named
from protocols.events import Delta, Failed, Finished, TokenInfo
from protocols.generation import GenerationRequest
from protocols.lmi import (
    INFERENCE_COMPONENT,
    MEDIA_TYPES,
    HandlerFailure,
    Line,
    Output,
    PayloadError,
    _Payload,
    lmi_status,
    payload_error,
)
from protocols.lmi import Answer as LmiAnswer
from protocols.lmi_answers import LmiEncoder, failed_answer, failed_line
from protocols.lmi_requests import (
    InvalidPayload,
    LmiRequest,
    adapter_field,
    decode_lmi,
    is_chat,
    with_component,
)
from protocols.names import Protocol
from protocols.openai_answers import Answer as ChatAnswer
from protocols.openai_answers import ErrorBody
from protocols.openai_requests import ChatRequest

# LMI's `/invocations`, which the SageMaker runtime's routes serve too: LMI's own bodies and
# answers, or a chat (DJL's rule: a body holding `messages`) answered as /v1/chat/completions;
# a failed generation is a 424 answer whose details say `error`.
LMI_ANSWER = (LmiAnswer, list[LmiAnswer], ChatAnswer)
LMI_ERROR = (PayloadError, HandlerFailure, *LMI_ANSWER, ErrorBody)
LMI_BODY = (_Payload, ChatRequest)
LMI_OK = {JSON: LMI_ANSWER, "application/jsonlines": TEXT, SSE: Events(Line)}


def formatter_of(accept: str | None, configured: str) -> str:
    """A request may ask for SSE (or jsonlines) through Accept; else the configured formatter."""
    if accept and "text/event-stream" in accept:
        return "sse"
    if accept and "application/jsonlines" in accept:
        return "jsonlines"
    return configured


def requests_of(lmi: LmiRequest) -> list[GenerationRequest]:
    return [
        GenerationRequest(
            options=lmi.options,
            prompt=prompt,
            index=i,
            stream=lmi.output != "json",
            truncate=lmi.truncate,
            priority=lmi.priority,
            prompt_field=f"$.inputs[{i}]" if lmi.dynamic else "$.inputs",
            asked=lmi.asked,
            constraint_field=lmi.constraint_field,
            adapter=lmi.adapters[i] if lmi.adapters else None,
            adapter_field=adapter_field(lmi, i),
        )
        for i, prompt in enumerate(lmi.inputs)
    ]


def _target(
    request: Request, target: str | None, component: str | None
) -> tuple[ChatModel, str | None] | Whole:
    """The chat model a request's path (`/predictions/{model}`), TargetModel or
    InferenceComponentName names, and the adapter left for `component`. With one chat model any
    path name is it (a single-model container's name is the endpoint's); with several, a name
    none of them serves is LMI's 404."""
    gateway = gateway_of(request)
    chats = gateway.chats
    if component and (by_component := chats.named(component)) is not None:
        return by_component, None
    if target and (by_target := chats.named(target)) is not None:
        return by_target, component
    if target and len(chats) > 1 and gateway.models.task_of(target) is None:
        served = ", ".join(f"`{name}`" for name in chats.names())
        why = f"Model not found: `{target}`; this server serves {served}"
        return Whole(404, payload_error(why, 404, dynamic=False), JSON)
    chosen = chat_model_for(gateway, asked_model(request, None))
    if isinstance(chosen, ModelRefused):
        return Whole(
            chosen.status, payload_error(chosen.error.message, chosen.status, dynamic=False), JSON
        )
    return chosen, component


async def answer(
    request: Request,
    raw: bytes,
    accept: str | None,
    protocol: Protocol = Protocol.LMI,
    target: str | None = None,
) -> Prepared:
    """`target`: the model the path or TargetModel names."""
    targeted = _target(request, target, request.headers.get(INFERENCE_COMPONENT))
    if isinstance(targeted, Whole):
        return targeted
    model, component = targeted
    if is_chat(raw):
        lines = formatter_of(accept, "jsonlines") != "sse"
        return await prepare(
            request,
            raw,
            chat=True,
            protocol=protocol,
            lines=lines,
            component=component,
            model=model,
        )
    gateway = gateway_of(request)
    settings = gateway.settings
    try:
        lmi = decode_lmi(
            raw,
            formatter=formatter_of(accept, settings.option_output_formatter),
            tgi_compat=settings.option_tgi_compat,
            max_new_tokens=settings.lmi_max_new_tokens,
            max_stop=settings.max_stop_sequences,
        )
    except InvalidPayload as e:
        if e.output is not None and not e.dynamic:  # a bad generation parameter value
            return _bad_parameter(named(e.error), e.output, settings.option_tgi_compat)
        return Whole(424, payload_error(named(e.error), 424, dynamic=e.dynamic), JSON)
    lmi = with_component(lmi, component)
    encoder = LmiEncoder(lmi)
    steps = model.batches.run(requests_of(lmi), protocol)
    if lmi.output == "json":
        outcome = await until_disconnect(request, _all_or_first_failure(steps))
        if outcome is None:
            return CLIENT_GONE
        if isinstance(outcome, Failed):
            return _refusal(outcome, lmi, encoder)
        answers = [encoder.answer(p, f) for p, f in zip(lmi.inputs, outcome, strict=True)]
        return Whole(200, encoder.document(answers), JSON)

    def refuse(head: list[Step]) -> Whole | None:
        failed = next((e for e in head[-1] if isinstance(e, Failed)), None)
        return None if failed is None else _refusal(failed, lmi, encoder)

    chunks: Chunks[Step]
    if lmi.dynamic:
        chunks = partial(_outputs, encoder=encoder, count=len(lmi.inputs))
    else:
        chunks = partial(_lines, lmi.inputs[0], encoder=encoder)
    return await streamed(
        request,
        steps,
        ready=has_output,
        refuse=refuse,
        chunks=chunks,
        media_type=encoder.media_type,
    )


def _refusal(failed: Failed, lmi: LmiRequest, encoder: LmiEncoder) -> Whole:
    """A prompt that failed before any output: the spec's status and body for its kind."""
    if lmi.dynamic:
        return Whole(424, payload_error(_where(failed), 424, dynamic=True), JSON)
    error, streaming = failed.error(), lmi.output != "json"
    if error.kind in (ErrorKind.ENGINE_ERROR, ErrorKind.UNPROCESSABLE):  # the engine's verdict
        if streaming:
            return Whole(424, encoder.failed_line(error.message), encoder.media_type)
        return Whole(424, encoder.failed_answer(error.message), JSON)
    status = lmi_status(error.kind)
    return Whole(status, payload_error(named(error), status, dynamic=False), JSON)


def _bad_parameter(message: str, output: Output, tgi_compat: bool) -> Whole:
    """The spec's answer to "a bad generation parameter value": a generation that failed."""
    if output == "json":
        return Whole(424, failed_answer(message, tgi_compat=tgi_compat), JSON)
    return Whole(424, failed_line(message, output, tgi_compat=tgi_compat), MEDIA_TYPES[output])


def _where(failed: Failed) -> str:
    return f"{failed.message} - at `$.inputs[{failed.index}]`"


async def _all_or_first_failure(steps: AsyncGenerator[Step, None]) -> list[Finished] | Failed:
    """Every prompt's Finished in payload order, or the first failure (which stops the rest)."""
    done: dict[int, Finished] = {}
    async with aclosing(steps):
        async for step in steps:
            for event in step:
                if isinstance(event, Failed):
                    return event
                if isinstance(event, Finished):
                    done[event.index] = event
    return [done[i] for i in sorted(done)]


async def _lines(
    prompt: str, head: list[Step], rest: AsyncIterator[Step], *, encoder: LmiEncoder
) -> AsyncGenerator[Chunk, None]:
    last: list[TokenInfo] = []  # the last step's tokens wait for the Finished that follows
    async for step in chained(head, rest):
        for event in step:
            match event:
                case Delta(tokens=tokens, finish_reason=None):
                    yield Chunk(encoder.lines(prompt, tokens or [], None))
                case Delta(tokens=tokens):
                    last = tokens or []
                case Finished():
                    yield Chunk(encoder.lines(prompt, last, event))
                case Failed(message=message):
                    yield Chunk(encoder.failed_line(message), message)


async def _outputs(
    head: list[Step], rest: AsyncIterator[Step], *, encoder: LmiEncoder, count: int
) -> AsyncGenerator[Chunk, None]:
    async for step in chained(head, rest):
        texts = [""] * count
        for event in step:
            if isinstance(event, Failed):
                message = _where(event)
                yield Chunk(encoder.frame(payload_error(message, 424, dynamic=True)), message)
                return
            if isinstance(event, Delta):
                texts[event.index] += event.text
        if any(texts):
            yield Chunk(encoder.outputs(texts))
