"""A chat (or text) completions answer, prepared: OpenAI's `/v1/chat/completions` and
`/v1/completions`, and every route that answers a chat as they do (LMI's `/invocations` with
`messages`, SageMaker's through it, the Responses API's refusals and streams). The codecs are
protocols/openai_*.py; every prompt goes through the one engine path (BatchRunner)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from functools import partial
from typing import NamedTuple

from msgspec.structs import replace
from starlette.requests import Request

from gateway.engine_path.chat_model import ChatModel
from gateway.engine_path.served_model import ServedModel
from gateway.http.model_choice import ModelRefused, asked_model, body_model, chat_model_for
from gateway.http.prepared import (
    CLIENT_GONE,
    JSON,
    JSON_LINES,
    SSE,
    SSE_HEADERS,
    Chunk,
    Prepared,
    Whole,
    streamed,
)
from gateway.http.streaming import Step, chained, collect, has_output
from gateway.observability.tracing import refused
from gateway.state import gateway_of
from protocols.errors import GenerationError
from protocols.events import Delta, Failed, Finished
from protocols.lmi import INFERENCE_COMPONENT
from protocols.names import Protocol
from protocols.openai_answers import OpenAIEncoder, error_of, not_found
from protocols.openai_requests import (
    ANY_MODEL,
    OpenAICall,
    decode_chat,
    decode_completion,
    unknown_model,
)
from protocols.sampling_defaults import with_defaults
from protocols.tool_calls import ToolAnswers


def error_answer(error: GenerationError) -> Whole:
    """An error in OpenAI's shape, with its status (the request's trace fails with it)."""
    refused(error)
    status, body = error_of(error)
    return Whole(status, body, JSON)


def openai_refusal(refused: ModelRefused) -> Whole:
    """A model not served (404) or of the other task (400), in OpenAI's shape."""
    if refused.status == 404:
        return Whole(404, not_found(refused.error.message), JSON)
    return error_answer(refused.error)


class ModelNotServed(Exception):
    """A request's `model` names neither the served model nor one of its adapters."""


class Resolved(NamedTuple):
    """A decoded chat call made ready for the engine path: its token prompts spelled, held to
    its tools' needs, its adapter named; `tools` reads its answers for calls; `model` is the
    name its answer gives."""

    call: OpenAICall
    tools: ToolAnswers | None
    model: str


async def resolve(model: ServedModel, call: OpenAICall, component: str | None = None) -> Resolved:
    """`call` for the engine path. `model` names the base model or a LoRA adapter; `component`
    (SageMaker's inference component header) an adapter for a request whose `model` names
    none. Raises GenerationError (a refusal) or ModelNotServed (404, its message the why)."""
    tools: ToolAnswers | None = None
    defaulted = [with_defaults(r, model.sampling_defaults) for r in call.requests]
    call = replace(call, requests=defaulted)
    if call.names_token_ids:
        call = await model.spell(call)
    if call.tool_use is not None:  # its parsers read the engine's tokenizer
        tools, held = await model.tool_calling(call.tool_use, call.requests)
        call = replace(call, requests=held)
    adapter: tuple[str, str] | None = (component, INFERENCE_COMPONENT) if component else None
    if unknown_model(call.model, model.name) is not None:
        # its adapters are the other models served
        why = unknown_model(call.model, model.name, await model.adapter_names())
        if why is not None:
            raise ModelNotServed(why)
        adapter = (call.model or "", "model")
    if adapter is None:
        return Resolved(call, tools, model.name)
    name, field = adapter
    requests = [replace(r, adapter=name, adapter_field=field) for r in call.requests]
    return Resolved(replace(call, requests=requests), tools, name)


async def prepare(
    request: Request,
    raw: bytes,
    *,
    chat: bool,
    protocol: Protocol,
    lines: bool = False,
    component: str | None = None,
    model: ChatModel | None = None,
) -> Prepared:
    """The answer to a chat (or text) completions request; `lines`: stream JSON lines (LMI's
    chat framing) rather than server-sent events; `component` as `resolve` reads it; `model`:
    the chat model a route's path or header picked, for a body that names none."""
    gateway = gateway_of(request)
    decode = decode_chat if chat else decode_completion
    named = body_model(raw)
    if model is not None and (named is None or named in ANY_MODEL):
        chosen: ChatModel | ModelRefused = model
    else:
        chosen = chat_model_for(gateway, asked_model(request, named))
    if isinstance(chosen, ModelRefused):
        return openai_refusal(chosen)
    try:
        decoded = decode(raw, chosen.served.context_length())
        call, tools, served = await resolve(chosen.served, decoded, component)
    except GenerationError as e:
        return error_answer(e)
    except ModelNotServed as e:
        return Whole(404, not_found(str(e)), JSON)
    encoder = OpenAIEncoder(call, served, chat=chat, lines=lines, tools=tools)
    steps = chosen.batches.run(call.requests, protocol)
    if not call.stream:
        collected = await collect(request, steps)
        if collected is None:
            return CLIENT_GONE
        ends = {e.index: e for step in collected for e in step if isinstance(e, Finished | Failed)}
        outcomes = [ends[i] for i in sorted(ends)]
        failed = next((o for o in outcomes if isinstance(o, Failed)), None)
        if failed is not None:
            return error_answer(failed.error())
        done = [o for o in outcomes if isinstance(o, Finished)]
        return Whole(200, encoder.document(done), JSON)
    return await streamed(
        request,
        steps,
        ready=has_output,
        refuse=refusal,
        chunks=partial(_chunks, encoder=encoder),
        media_type=JSON_LINES if lines else SSE,
        headers=None if lines else SSE_HEADERS,
    )


def refused_with(
    answer: Callable[[GenerationError], Whole],
) -> Callable[[list[Step]], Whole | None]:
    """What a stream's head answers instead of a stream: a prompt that failed before anything
    streamed keeps its status, in the shape `answer` gives its error."""

    def refused(head: list[Step]) -> Whole | None:
        failed = next((e for e in head[-1] if isinstance(e, Failed)), None)
        began = any(isinstance(e, Delta) for step in head for e in step)
        return answer(failed.error()) if failed is not None and not began else None

    return refused


refusal = refused_with(error_answer)  # in OpenAI's shape


async def _chunks(
    head: list[Step], rest: AsyncIterator[Step], encoder: OpenAIEncoder
) -> AsyncGenerator[Chunk, None]:
    opened: set[int] = set()
    async for step in chained(head, rest):
        for event in step:
            match event:
                case Delta(index=index):
                    data = encoder.chunk(event)
                    if encoder.chat and index not in opened:
                        opened.add(index)
                        data = encoder.opening(index) + data  # one write for both
                    if data:
                        yield Chunk(data)
                case Finished(index=index):
                    encoder.count(event, first=index % encoder.call.choices == 0)
                    if encoder.call.echo_prompts is not None:
                        yield Chunk(encoder.whole_choice(event))
                case Failed():
                    yield Chunk(encoder.failure(event.error()), event.message)
                    return
    yield Chunk(encoder.closing())
