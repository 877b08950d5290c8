"""The one shape of an HTTP answer: prepared (whole, or a stream of chunks), then written.

Every HTTP route that generates prepares its answer as a `Prepared` and writes it with
`to_response`: a whole answer is collected (streaming.py's `collect`; None, so CLIENT_GONE,
when the client left first); a stream is opened by `streamed`, which reads the source until
it is `ready` to commit, answers a refusal before that with its own status, and builds the
chunks from what it read and the rest. A route that changes only the framing (SageMaker's)
rewrites the chunks of another's `Prepared` before writing it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from typing import NamedTuple, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from gateway.http.streaming import CLIENT_GONE_STATUS, ClosingStream, closer, open_stream

T = TypeVar("T")
JSON = "application/json"
JSON_LINES = "application/jsonlines"
SSE = "text/event-stream"
SSE_HEADERS = {"X-Accel-Buffering": "no", "Cache-Control": "no-cache"}


class Whole(NamedTuple):
    status: int
    body: bytes
    media_type: str
    headers: Mapping[str, str] | None = None


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
Chunks = Callable[[list[T], AsyncIterator[T]], AsyncGenerator[Chunk, None]]


async def streamed(
    request: Request,
    source: AsyncGenerator[T, None],
    *,
    ready: Callable[[T], bool],
    refuse: Callable[[list[T]], Whole | None],
    chunks: Chunks[T],
    media_type: str,
    headers: Mapping[str, str] | None = None,
) -> Prepared:
    """A stream of `chunks(head, rest)` once the source is `ready` (its `head` read), unless
    `refuse(head)` answers instead; CLIENT_GONE if the client left first. The source is
    closed with the stream, or at once when there is none."""
    head = await open_stream(request, source, ready)
    if head is None:
        return CLIENT_GONE
    refused = refuse(head)
    if refused is not None:
        await source.aclose()
        return refused
    body = chunks(head, source)
    return Streamed(media_type, body, closer(body, source), headers)


def to_response(prepared: Prepared, headers: Mapping[str, str] | None = None) -> Response:
    merged = {**(prepared.headers or {}), **(headers or {})} or None
    if isinstance(prepared, Whole):
        return Response(prepared.body, prepared.status, merged, prepared.media_type)
    return ClosingStream(_data(prepared.chunks), prepared.media_type, prepared.close, merged)


async def _data(chunks: AsyncIterator[Chunk]) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        yield chunk.data
