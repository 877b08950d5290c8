"""A route's answer prepared but not yet written: whole, or a stream of chunks.

The LMI and OpenAI handlers prepare their answers this way so the SageMaker runtime routes can
reuse them and change only the framing (a whole answer in a ModelError, a stream in event-stream
PayloadPart frames).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import NamedTuple

from starlette.responses import Response

from gateway.routes.streaming import CLIENT_GONE_STATUS, ClosingStream

JSON = "application/json"


class Whole(NamedTuple):
    status: int
    body: bytes
    media_type: str


class Chunk(NamedTuple):
    data: bytes
    failure: str | None = None  # set on the stream's last chunk when its generation failed


class Streamed(NamedTuple):
    media_type: str
    chunks: AsyncIterator[Chunk]
    close: Callable[[], Awaitable[None]]
    headers: Mapping[str, str] | None = None


Prepared = Whole | Streamed
CLIENT_GONE = Whole(CLIENT_GONE_STATUS, b"", JSON)  # never seen by anyone: the client has left


def to_response(prepared: Prepared, headers: Mapping[str, str] | None = None) -> Response:
    if isinstance(prepared, Whole):
        return Response(prepared.body, prepared.status, headers, prepared.media_type)
    merged = {**(prepared.headers or {}), **(headers or {})}
    return ClosingStream(_data(prepared.chunks), prepared.media_type, prepared.close, merged)


async def _data(chunks: AsyncIterator[Chunk]) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        yield chunk.data
