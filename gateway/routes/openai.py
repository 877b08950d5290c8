"""OpenAI's API: POST `/v1/chat/completions` (also TGI's Messages API, which
`huggingface_hub.InferenceClient.chat_completion` calls), POST `/v1/completions`, GET
`/v1/models`. The codecs are protocols/openai_*.py; every prompt goes through the one engine
path (gateway/engine_path/batch.py over gateway/engine_path/generation.py).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

import msgspec
from msgspec.structs import replace
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.config.settings import served_model_name
from gateway.engine.tool_calls import ToolCalling
from gateway.routes.prepared import CLIENT_GONE, JSON, Chunk, Prepared, Streamed, Whole, to_response
from gateway.routes.streaming import chained, closer, collect, open_stream
from gateway.state import Gateway, gateway_of
from protocols.errors import GenerationError
from protocols.events import Delta, Event, Failed, Finished
from protocols.lmi import INFERENCE_COMPONENT
from protocols.names import Protocol
from protocols.openai_answers import OpenAIEncoder, error_of, not_found
from protocols.openai_requests import decode_chat, decode_completion, spelled, unknown_model

SSE = "text/event-stream"
JSON_LINES = "application/jsonlines"
SSE_HEADERS = {"X-Accel-Buffering": "no", "Cache-Control": "no-cache"}
Step = list[Event]


def context_length(gateway: Gateway) -> int:
    engine = gateway.holder.engine
    return engine.max_model_len if engine is not None else gateway.settings.engine.max_model_len


def error_answer(error: GenerationError) -> Whole:
    status, body = error_of(error)
    return Whole(status, body, JSON)


async def prepare(
    request: Request,
    raw: bytes,
    *,
    chat: bool,
    protocol: Protocol,
    lines: bool = False,
    component: str | None = None,
) -> Prepared:
    """The answer to a chat (or text) completions request; `lines`: stream JSON lines (LMI's
    chat framing) rather than server-sent events. `model` names the base model or a LoRA
    adapter; `component` (SageMaker's inference component header) an adapter for a request
    whose `model` names none."""
    gateway = gateway_of(request)
    decode = decode_chat if chat else decode_completion
    tools: ToolCalling | None = None
    try:
        call = decode(raw, context_length(gateway))
        if call.token_prompts:
            engine = await gateway.holder.wait()  # its tokenizer spells the prompts
            call = spelled(call, engine.vocabulary, engine.decode)
        if call.tool_use is not None:  # its parsers read the engine's tokenizer
            tools = gateway.tool_parsing.calling(call.tool_use, await gateway.holder.wait())
            call = msgspec.structs.replace(call, requests=tools.constrained(call.requests))
    except GenerationError as e:
        return error_answer(e)
    served = served_model_name(gateway.settings.engine)
    adapter: tuple[str, str] | None = (component, INFERENCE_COMPONENT) if component else None
    if unknown_model(call.model, served) is not None:
        try:
            engine = await gateway.holder.wait()  # its adapters are the other models served
        except GenerationError as e:
            return error_answer(e)
        why = unknown_model(call.model, served, engine.adapters.names)
        if why is not None:
            return Whole(404, not_found(why), JSON)
        adapter = (call.model or "", "model")
    if adapter is not None:
        name, field = adapter
        requests = [replace(r, adapter=name, adapter_field=field) for r in call.requests]
        call = replace(call, requests=requests)
    encoder = OpenAIEncoder(
        call, adapter[0] if adapter else served, chat=chat, lines=lines, tools=tools
    )
    steps = gateway.batches.run(call.requests, protocol)
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
    head = await opened_stream(request, steps)
    if isinstance(head, Whole):
        return head
    chunks = _chunks(head, steps, encoder)
    media_type = JSON_LINES if lines else SSE
    return Streamed(media_type, chunks, closer(chunks, steps), None if lines else SSE_HEADERS)


def _has_output(step: Step) -> bool:
    return any(isinstance(e, Delta | Finished | Failed) for e in step)


async def opened_stream(request: Request, steps: AsyncGenerator[Step, None]) -> list[Step] | Whole:
    """A stream's steps up to its first output, or the answer instead of a stream: the
    client gone, or a prompt refused before anything streamed (with its status)."""
    head = await open_stream(request, steps, _has_output)
    if head is None:
        return CLIENT_GONE
    refused = _refusal(head)
    if refused is not None:
        await steps.aclose()
        return refused
    return head


def _refusal(head: list[Step]) -> Whole | None:
    """A prompt that failed before anything streamed keeps its status."""
    failed = next((e for e in head[-1] if isinstance(e, Failed)), None)
    streamed = any(isinstance(e, Delta) for step in head for e in step)
    return error_answer(failed.error()) if failed is not None and not streamed else None


async def _chunks(
    head: list[Step], rest: AsyncIterator[Step], encoder: OpenAIEncoder
) -> AsyncGenerator[Chunk, None]:
    opened: set[int] = set()
    async for step in chained(head, rest):
        for event in step:
            match event:
                case Delta(index=index):
                    if encoder.chat and index not in opened:
                        opened.add(index)
                        yield Chunk(encoder.opening(index))
                    data = encoder.chunk(event)
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


async def chat_completions(request: Request) -> Response:
    raw = await request.body()
    return to_response(await prepare(request, raw, chat=True, protocol=Protocol.OPENAI_CHAT))


async def completions(request: Request) -> Response:
    raw = await request.body()
    protocol = Protocol.OPENAI_COMPLETIONS
    return to_response(await prepare(request, raw, chat=False, protocol=protocol))


class _Model(msgspec.Struct, omit_defaults=True):
    id: str
    max_model_len: int
    object: str = "model"
    created: int = 0
    owned_by: str = "llm-gateway"
    root: str | None = None  # an adapter's: where it was loaded from, as vLLM lists it
    parent: str | None = None  # an adapter's base model


class _Models(msgspec.Struct):
    data: list[_Model]
    object: str = "list"


async def models(request: Request) -> Response:
    gateway = gateway_of(request)
    served = served_model_name(gateway.settings.engine)
    context = context_length(gateway)
    models = [_Model(served, context)]
    engine = gateway.holder.engine
    if engine is not None:
        models += [
            _Model(name, context, root=str(path), parent=served)
            for name, path in engine.adapters.paths.items()
        ]
    return Response(msgspec.json.encode(_Models(models)), media_type=JSON)


routes = [
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/models", models, methods=["GET"]),
]
