"""TGI's native routes: POST `/`, `/generate`, `/generate_stream` and GET `/info`.

GET `/health` is served by routes/health.py (200 once ready, 503 before), which is all
`InferenceClient.health_check()` reads. As in TGI, a streamed request answers 200 whatever
happens: a failure, validation included, is a `data:` event carrying `{error, error_type}`.
The one prompt runs through `BatchRunner`, as every route's does: a stream nobody reads goes
on to its end, and leaves its admission slot and its caller's concurrency.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from functools import partial

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.config.version import version
from gateway.http.chat import refused_with
from gateway.http.embedding_answers import tei_body_of, tei_info, tei_invocation
from gateway.http.model_choice import ModelRefused, asked_model, chat_model_for
from gateway.http.openapi import Events, Op
from gateway.http.prepared import (
    CLIENT_GONE,
    JSON,
    SSE,
    SSE_HEADERS,
    Chunk,
    Prepared,
    Whole,
    streamed,
    to_response,
)
from gateway.http.streaming import Step, chained, collect, ended, has_output
from gateway.observability.tracing import refused
from gateway.state import gateway_of
from protocols import tei
from protocols.errors import GenerationError
from protocols.events import Delta, Failed, Finished, TokenInfo
from protocols.generation import GenerationRequest
from protocols.json_body import MALFORMED
from protocols.names import Protocol
from protocols.tgi import (
    ErrorResponse,
    GenerateResponse,
    Info,
    StreamResponse,
    TgiEncoder,
    _Payload,
    decode_tgi,
    encode_info,
    error_body,
    error_event,
)

DEFAULT_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _asks_stream(raw: bytes) -> bool:
    """Whether a payload that failed validation had asked for a stream (POST `/`)."""
    try:
        doc = msgspec.json.decode(raw)
    except MALFORMED:
        return False
    return isinstance(doc, dict) and doc.get("stream") is True


def _sse_error(error: GenerationError) -> Whole:
    refused(error)
    return Whole(200, error_event(error), SSE, SSE_HEADERS)


def _json_error(error: GenerationError) -> Whole:
    refused(error)
    status, body = error_body(error)
    return Whole(status, body, JSON)


_refusal = refused_with(_sse_error)  # a failure before any text: its error event alone


async def _serve(
    request: Request, *, stream_flag: bool | None, listed: bool, full_text_default: bool
) -> Prepared:
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
    # TGI names a model only as a LoRA adapter (`adapter_id`): a chat model's name picks it
    named = call.adapter if call.adapter and gateway.chats.find(call.adapter) else None
    chosen = chat_model_for(gateway, asked_model(request, named), "$.parameters.adapter_id")
    if isinstance(chosen, ModelRefused):
        if call.stream:
            return _sse_error(chosen.error)
        return Whole(chosen.status, error_body(chosen.error)[1], JSON)
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
    # The one engine path's hand-off: an unread stream's generation goes on to its end.
    steps = chosen.batches.run([generation], Protocol.TGI)
    if not call.stream:
        collected = await collect(request, steps)
        if collected is None:
            return CLIENT_GONE
        last = ended(collected)
        if isinstance(last, Failed):
            return _json_error(last.error())
        return Whole(200, encoder.document(last, listed=listed), JSON)
    return await streamed(
        request,
        steps,
        ready=has_output,
        refuse=_refusal,
        chunks=partial(_events, encoder=encoder),
        media_type=SSE,
        headers=SSE_HEADERS,
    )


async def _events(
    head: list[Step], rest: AsyncIterator[Step], encoder: TgiEncoder
) -> AsyncGenerator[Chunk, None]:
    last: list[TokenInfo] = []  # the last step's tokens wait for the Finished that follows
    async for step in chained(head, rest):
        for event in step:
            match event:
                case Delta(tokens=tokens, finish_reason=None):
                    yield Chunk(encoder.events(tokens or [], None))
                case Delta(tokens=tokens):
                    last = tokens or []
                case Finished():
                    yield Chunk(encoder.events(last, event))
                case Failed():
                    yield Chunk(error_event(event.error()), event.message)


async def compat_generate(request: Request) -> Response:
    """POST `/`: `stream` in the payload picks the form; the JSON answer is a one-item list.
    With an embedding model served, TEI's body (`is_tei_body`) is answered as TEI does."""
    tei_body = tei_body_of(gateway_of(request), await request.body())
    if tei_body is not None:
        return to_response(await tei_invocation(gateway_of(request), tei_body))
    prepared = await _serve(request, stream_flag=None, listed=True, full_text_default=True)
    return to_response(prepared)


async def generate_route(request: Request) -> Response:
    prepared = await _serve(request, stream_flag=False, listed=False, full_text_default=False)
    return to_response(prepared)


async def generate_stream(request: Request) -> Response:
    prepared = await _serve(request, stream_flag=True, listed=False, full_text_default=False)
    return to_response(prepared)


async def info(request: Request) -> Response:
    """TGI's info of the chat model; TEI's of the embedding model with `?model=` its name."""
    gateway = gateway_of(request)
    asked = request.query_params.get("model")
    if asked and gateway.models.task_of(asked) == "embed":
        return to_response(await tei_info(gateway, version(), asked))
    chosen = chat_model_for(gateway, asked_model(request, asked))
    if isinstance(chosen, ModelRefused):
        return to_response(Whole(chosen.status, error_body(chosen.error)[1], JSON))
    settings, model = chosen.spec.settings, chosen.served
    model_id = settings.engine.served_model_name or settings.engine.model or DEFAULT_MODEL_ID
    total = model.context_length()
    dtype = model.dtype()
    body = Info(
        model_id=model_id,
        model_dtype=f"torch.{dtype}" if dtype is not None else None,
        max_concurrent_requests=settings.max_running_requests + settings.max_waiting_requests,
        max_best_of=settings.max_best_of,
        max_input_tokens=total - 1,
        max_input_length=total - 1,
        max_total_tokens=total,
        version=version(),
    )
    return to_response(Whole(200, encode_info(body), JSON))


routes = [
    Route("/", compat_generate, methods=["POST"]),
    Route("/generate", generate_route, methods=["POST"]),
    Route("/generate_stream", generate_stream, methods=["POST"]),
    Route("/info", info, methods=["GET"]),
]
# A streamed request answers 200 whatever happens, its error an SSE event.
EVENTS = Events((StreamResponse, ErrorResponse))
ERRORS = (401, 413, 422, 424, 429, 503)
operations = [
    Op(
        "post",
        "/",
        "TGI: `stream` picks the form",
        _Payload,
        {JSON: list[GenerateResponse], SSE: EVENTS},
        ErrorResponse,
        ERRORS,
    ),
    Op(
        "post",
        "/generate",
        "TGI generate",
        _Payload,
        {JSON: GenerateResponse},
        ErrorResponse,
        ERRORS,
    ),
    Op(
        "post", "/generate_stream", "TGI stream", _Payload, {SSE: EVENTS}, ErrorResponse, (401, 413)
    ),
    Op(
        "get",
        "/info",
        "TGI's info of the chat model; TEI's of the embedding model `model` names",
        None,
        {JSON: (Info, tei.Info)},
        (ErrorResponse, tei.ErrorResponse),
        (401, 404, 503),
        (("model", {"type": "string"}),),
    ),
]
