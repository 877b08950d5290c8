"""OpenAI's API: POST `/v1/chat/completions` (also TGI's Messages API, which
`huggingface_hub.InferenceClient.chat_completion` calls), POST `/v1/completions`, GET
`/v1/models`. The codecs are protocols/openai_*.py; every prompt goes through the one engine
path (gateway/batch.py over gateway/generation.py).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from functools import partial

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.config import served_model_name
from gateway.routes.streaming import chained, client_gone, collect, stream_answer
from gateway.state import Gateway, gateway_of
from protocols.errors import GenerationError
from protocols.generation import Delta, Event, Failed, Finished
from protocols.names import Protocol
from protocols.openai_answers import OpenAIEncoder, error_of, not_found
from protocols.openai_requests import decode_chat, decode_completion, unknown_model

JSON = "application/json"
SSE = "text/event-stream"
SSE_HEADERS = {"X-Accel-Buffering": "no", "Cache-Control": "no-cache"}
Step = list[Event]


def _context(gateway: Gateway) -> int:
    engine = gateway.holder.engine
    return engine.max_model_len if engine is not None else gateway.settings.engine.max_model_len


def _error(error: GenerationError) -> Response:
    status, body = error_of(error)
    return Response(body, status, media_type=JSON)


async def _serve(request: Request, *, chat: bool) -> Response:
    gateway = gateway_of(request)
    decode = decode_chat if chat else decode_completion
    try:
        call = decode(await request.body(), _context(gateway))
    except GenerationError as e:
        return _error(e)
    why = unknown_model(call, served_model_name(gateway.settings.engine))
    if why is not None:
        return Response(not_found(why), 404, media_type=JSON)
    protocol = Protocol.OPENAI_CHAT if chat else Protocol.OPENAI_COMPLETIONS
    encoder = OpenAIEncoder(call, chat=chat)
    steps = gateway.batches.run(call.requests, protocol)
    if not call.stream:
        collected = await collect(request, steps)
        if collected is None:
            return client_gone()
        ends = {e.index: e for step in collected for e in step if isinstance(e, Finished | Failed)}
        outcomes = [ends[i] for i in sorted(ends)]
        failed = next((o for o in outcomes if isinstance(o, Failed)), None)
        if failed is not None:
            return _error(failed.error())
        done = [o for o in outcomes if isinstance(o, Finished)]
        return Response(encoder.document(done), media_type=JSON)
    return await stream_answer(
        request,
        steps,
        ready=lambda step: any(isinstance(e, Delta | Finished | Failed) for e in step),
        refuse=_refusal,
        body=partial(_chunks, encoder=encoder),
        media_type=SSE,
        headers=SSE_HEADERS,
    )


def _refusal(head: list[Step]) -> Response | None:
    """A prompt that failed before anything streamed keeps its status."""
    failed = next((e for e in head[-1] if isinstance(e, Failed)), None)
    streamed = any(isinstance(e, Delta) for step in head for e in step)
    return _error(failed.error()) if failed is not None and not streamed else None


async def _chunks(
    head: list[Step], rest: AsyncIterator[Step], encoder: OpenAIEncoder
) -> AsyncGenerator[bytes, None]:
    opened: set[int] = set()
    async for step in chained(head, rest):
        for event in step:
            match event:
                case Delta(index=index):
                    if encoder.chat and index not in opened:
                        opened.add(index)
                        yield encoder.opening(index)
                    yield encoder.chunk(event)
                case Finished(index=index):
                    encoder.count(event, first=index % encoder.call.choices == 0)
                case Failed():
                    yield encoder.failure(event.error())
                    return
    yield encoder.closing()


async def chat_completions(request: Request) -> Response:
    return await _serve(request, chat=True)


async def completions(request: Request) -> Response:
    return await _serve(request, chat=False)


class _Model(msgspec.Struct):
    id: str
    max_model_len: int
    object: str = "model"
    created: int = 0
    owned_by: str = "llm-gateway"


class _Models(msgspec.Struct):
    data: list[_Model]
    object: str = "list"


async def models(request: Request) -> Response:
    gateway = gateway_of(request)
    model = _Model(served_model_name(gateway.settings.engine), _context(gateway))
    return Response(msgspec.json.encode(_Models([model])), media_type=JSON)


routes = [
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/models", models, methods=["GET"]),
]
