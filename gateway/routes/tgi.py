"""TGI's native routes: POST `/`, `/generate`, `/generate_stream` and GET `/info`.

GET `/health` is served by routes/health.py (200 once ready, 503 before), which is all
`InferenceClient.health_check()` reads. As in TGI, a streamed request answers 200 whatever
happens: a failure, validation included, is a `data:` event carrying `{error, error_type}`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from functools import partial
from importlib import metadata

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.routes.prepared import JSON
from gateway.routes.streaming import chained, client_gone, collect, stream_answer
from gateway.state import gateway_of
from protocols.errors import GenerationError
from protocols.events import Delta, Event, Failed, Finished, TokenInfo
from protocols.generation import GenerationRequest
from protocols.json_body import MALFORMED
from protocols.names import Protocol
from protocols.tgi import Info, TgiEncoder, decode_tgi, encode_info, error_body, error_event

SSE = "text/event-stream"
SSE_HEADERS = {"X-Accel-Buffering": "no", "Cache-Control": "no-cache"}
DEFAULT_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _asks_stream(raw: bytes) -> bool:
    """Whether a payload that failed validation had asked for a stream (POST `/`)."""
    try:
        doc = msgspec.json.decode(raw)
    except MALFORMED:
        return False
    return isinstance(doc, dict) and doc.get("stream") is True


def _sse_error(error: GenerationError) -> Response:
    return Response(error_event(error), 200, SSE_HEADERS, SSE)


def _json_error(error: GenerationError) -> Response:
    status, body = error_body(error)
    return Response(body, status, media_type=JSON)


async def _serve(
    request: Request, *, stream_flag: bool | None, listed: bool, full_text_default: bool
) -> Response:
    gateway = gateway_of(request)
    raw = await request.body()
    try:
        call = decode_tgi(
            raw,
            stream=stream_flag,
            full_text_default=full_text_default,
            max_new_tokens=gateway.settings.lmi_max_new_tokens,
        )
    except GenerationError as e:
        if stream_flag or (stream_flag is None and _asks_stream(raw)):
            return _sse_error(e)
        return _json_error(e)
    encoder = TgiEncoder(call)
    generation = GenerationRequest(
        options=call.options,
        prompt=call.inputs,
        stream=call.stream,
        truncate=call.truncate,
        prompt_field="$.inputs",
        asked=call.asked,
        constraint_field=call.constraint_field,
        adapter=call.adapter,
        adapter_field="$.parameters.adapter_id",
    )
    events = gateway.service.generate(generation, Protocol.TGI)
    if not call.stream:
        collected = await collect(request, events)
        if collected is None:
            return client_gone()
        last = collected[-1]
        if isinstance(last, Failed):
            return _json_error(last.error())
        assert isinstance(last, Finished)
        return Response(encoder.document(last, listed=listed), media_type=JSON)

    def refuse(head: list[Event]) -> Response | None:
        return _sse_error(head[-1].error()) if isinstance(head[-1], Failed) else None

    return await stream_answer(
        request,
        events,
        ready=lambda e: isinstance(e, Delta | Finished | Failed),
        refuse=refuse,
        body=partial(_events, encoder=encoder),
        media_type=SSE,
        headers=SSE_HEADERS,
    )


async def _events(
    head: list[Event], rest: AsyncIterator[Event], encoder: TgiEncoder
) -> AsyncGenerator[bytes, None]:
    last: list[TokenInfo] = []  # the last step's tokens wait for the Finished that follows
    async for event in chained(head, rest):
        match event:
            case Delta(tokens=tokens, finish_reason=None):
                yield encoder.events(tokens or [], None)
            case Delta(tokens=tokens):
                last = tokens or []
            case Finished():
                yield encoder.events(last, event)
            case Failed():
                yield error_event(event.error())


async def compat_generate(request: Request) -> Response:
    """POST `/`: `stream` in the payload picks the form; the JSON answer is a one-item list."""
    return await _serve(request, stream_flag=None, listed=True, full_text_default=True)


async def generate_route(request: Request) -> Response:
    return await _serve(request, stream_flag=False, listed=False, full_text_default=False)


async def generate_stream(request: Request) -> Response:
    return await _serve(request, stream_flag=True, listed=False, full_text_default=False)


def _version() -> str:
    try:
        return metadata.version("llm-gateway")
    except metadata.PackageNotFoundError:
        return "0.1.0"


async def info(request: Request) -> Response:
    gateway = gateway_of(request)
    settings, engine = gateway.settings, gateway.holder.engine
    model_id = settings.engine.served_model_name or settings.engine.model or DEFAULT_MODEL_ID
    total = engine.max_model_len if engine is not None else settings.engine.max_model_len
    body = Info(
        model_id=model_id,
        model_dtype=f"torch.{engine.dtype}" if engine is not None else None,
        max_concurrent_requests=settings.max_running_requests + settings.max_waiting_requests,
        max_best_of=settings.max_best_of,
        max_input_tokens=total - 1,
        max_input_length=total - 1,
        max_total_tokens=total,
        version=_version(),
    )
    return Response(encode_info(body), media_type=JSON)


routes = [
    Route("/", compat_generate, methods=["POST"]),
    Route("/generate", generate_route, methods=["POST"]),
    Route("/generate_stream", generate_stream, methods=["POST"]),
    Route("/info", info, methods=["GET"]),
]
