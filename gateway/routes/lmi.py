"""POST `/invocations` and `/predictions/{model_name}`: the LMI schema (lmi-invocations.md).

`answer()` prepares a request's whole answer, or its stream, without writing it, so the
SageMaker runtime routes reuse it and change only the framing. A stream commits to 200 only
once its first token exists, so errors before that keep their 4xx/5xx status. Whatever way a
response ends, its generation is closed, which aborts the engine requests.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.state import gateway_of
from gateway.lmi_generation import PromptFailed, generate, generate_many, stream, stream_many
from gateway.routes.streaming import ClosingStream, until_disconnect
from protocols.errors import ErrorKind, GenerationError
from protocols.generation_plan import Piece, named
from protocols.lmi import (
    InvalidPayload,
    LmiEncoder,
    LmiRequest,
    decode_lmi,
    payload_error,
)

JSON = "application/json"
_STATUS = {
    ErrorKind.INVALID_REQUEST: 424,
    ErrorKind.CONTEXT_LENGTH_EXCEEDED: 424,
    ErrorKind.RATE_LIMITED: 429,
    ErrorKind.ENGINE_UNAVAILABLE: 503,
}


@dataclass(frozen=True)
class Whole:
    status: int
    body: bytes
    media_type: str


class Chunk(NamedTuple):
    data: bytes
    failure: str | None = None  # set on the stream's last chunk when its generation failed


@dataclass(frozen=True)
class Streamed:
    media_type: str
    chunks: AsyncIterator[Chunk]
    close: Callable[[], Awaitable[None]]


Prepared = Whole | Streamed
CLIENT_GONE = Whole(499, b"", JSON)  # never seen by anyone: the client has left


def formatter_of(accept: str | None, configured: str) -> str:
    """A request may ask for SSE (or jsonlines) through Accept; else the configured formatter."""
    if accept and "text/event-stream" in accept:
        return "sse"
    if accept and "application/jsonlines" in accept:
        return "jsonlines"
    return configured


async def answer(
    request: Request, raw: bytes, accept: str | None, protocol: str = "lmi"
) -> Prepared:
    gateway = gateway_of(request)
    settings = gateway.settings
    try:
        lmi = decode_lmi(
            raw,
            formatter=formatter_of(accept, settings.option_output_formatter),
            tgi_compat=settings.option_tgi_compat,
            max_new_tokens=settings.lmi_max_new_tokens,
        )
    except InvalidPayload as e:
        return Whole(424, payload_error(named(e.error), 424, dynamic=e.dynamic), JSON)
    if lmi.dynamic:
        return await _dynamic(request, lmi, protocol)
    return await _rolling(request, lmi, protocol)


def _failure(error: GenerationError, encoder: LmiEncoder, *, streaming: bool) -> Whole:
    """An error before any token: its status, and the spec's body for its kind."""
    if error.kind is ErrorKind.ENGINE_ERROR:
        if streaming:
            return Whole(424, encoder.failed_line(error.message), encoder.media_type)
        return Whole(424, encoder.failed_answer(error.message), JSON)
    status = _STATUS.get(error.kind, 500)
    return Whole(status, payload_error(named(error), status, dynamic=False), JSON)


async def _rolling(request: Request, lmi: LmiRequest, protocol: str) -> Prepared:
    service, encoder, prompt = gateway_of(request).service, LmiEncoder(lmi), lmi.inputs[0]
    if lmi.output == "json":
        try:
            done = await until_disconnect(request, generate(service, prompt, lmi.plan, protocol))
        except GenerationError as e:
            return _failure(e, encoder, streaming=False)
        if done is None:
            return CLIENT_GONE
        return Whole(200, encoder.document([encoder.answer(prompt, done)]), JSON)
    pieces = stream(service, prompt, lmi.plan, protocol)
    try:
        first = await until_disconnect(request, anext(pieces))
    except GenerationError as e:
        await pieces.aclose()
        return _failure(e, encoder, streaming=True)
    if first is None:
        await pieces.aclose()
        return CLIENT_GONE
    chunks = _lines(prompt, first, pieces, encoder)
    return Streamed(encoder.media_type, chunks, _closer(chunks, pieces))


async def _lines(
    prompt: str, first: Piece, pieces: AsyncIterator[Piece], encoder: LmiEncoder
) -> AsyncGenerator[Chunk, None]:
    piece = first
    try:
        while True:
            yield Chunk(encoder.lines(prompt, piece))
            if piece.final is not None:
                return
            piece = await anext(pieces)
    except GenerationError as e:
        yield Chunk(encoder.failed_line(e.message), e.message)


def _where(failed: PromptFailed) -> str:
    return f"{failed.error.message} - at `$.inputs[{failed.index}]`"


async def _dynamic(request: Request, lmi: LmiRequest, protocol: str) -> Prepared:
    service, encoder = gateway_of(request).service, LmiEncoder(lmi)
    if lmi.output == "json":
        try:
            done = await until_disconnect(
                request, generate_many(service, lmi.inputs, lmi.plan, protocol)
            )
        except PromptFailed as e:
            return Whole(424, payload_error(_where(e), 424, dynamic=True), JSON)
        if done is None:
            return CLIENT_GONE
        answers = [encoder.answer(p, g) for p, g in zip(lmi.inputs, done, strict=True)]
        return Whole(200, encoder.document(answers), JSON)
    batches = stream_many(service, lmi.inputs, lmi.plan, protocol)
    try:
        first = await until_disconnect(request, anext(batches))
    except PromptFailed as e:
        await batches.aclose()
        return Whole(424, payload_error(_where(e), 424, dynamic=True), JSON)
    if first is None:
        await batches.aclose()
        return CLIENT_GONE
    chunks = _outputs(first, batches, encoder, len(lmi.inputs))
    return Streamed(encoder.media_type, chunks, _closer(chunks, batches))


async def _outputs(
    first: list[tuple[int, Piece]],
    batches: AsyncIterator[list[tuple[int, Piece]]],
    encoder: LmiEncoder,
    count: int,
) -> AsyncGenerator[Chunk, None]:
    batch: list[tuple[int, Piece]] | None = first
    try:
        while batch is not None:
            texts = [""] * count
            for index, piece in batch:
                texts[index] += piece.text
            if any(texts):
                yield Chunk(encoder.outputs(texts))
            batch = await anext(batches, None)
    except PromptFailed as e:
        message = _where(e)
        yield Chunk(encoder.frame(payload_error(message, 424, dynamic=True)), message)


def _closer(
    chunks: AsyncGenerator[Chunk, None], source: AsyncGenerator[object, None]
) -> Callable[[], Awaitable[None]]:
    async def close() -> None:
        await chunks.aclose()
        await source.aclose()  # also when `chunks` never started

    return close


def to_response(prepared: Prepared, headers: Mapping[str, str] | None = None) -> Response:
    if isinstance(prepared, Whole):
        return Response(prepared.body, prepared.status, headers, prepared.media_type)
    return ClosingStream(_data(prepared.chunks), prepared.media_type, prepared.close, headers)


async def _data(chunks: AsyncIterator[Chunk]) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        yield chunk.data


async def invocations(request: Request) -> Response:
    raw = await request.body()
    return to_response(await answer(request, raw, request.headers.get("accept")))


routes = [
    Route("/invocations", invocations, methods=["POST"]),
    Route("/predictions/{model_name}", invocations, methods=["POST"]),
]
