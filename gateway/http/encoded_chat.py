"""A chat family's answer from its encoder: the one-prompt chat routes that speak another
vendor's API (Anthropic's Messages, Cohere's chat, Ollama's chat and generate) answer the same
way, whole or streamed (server-sent events, or Ollama's NDJSON), and differ only in how the
answer is encoded and how an error looks.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from functools import partial
from typing import Protocol

from starlette.requests import Request

from gateway.http.chat import refused_with
from gateway.http.prepared import (
    CLIENT_GONE,
    JSON,
    SSE,
    SSE_HEADERS,
    Chunk,
    Prepared,
    Whole,
    streamed,
)
from gateway.http.streaming import Step, chained, collect, ended, has_output
from protocols.errors import GenerationError
from protocols.events import Delta, Failed, Finished


class ChatEncoder(Protocol):
    """One answer's encoding: the whole document, or the stream's opening, each step's events,
    its closing, and a failure after the stream began."""

    def document(self, done: Finished) -> bytes: ...

    def opening(self) -> bytes: ...

    def chunk(self, delta: Delta) -> bytes: ...

    def closing(self, done: Finished) -> bytes: ...

    def failure(self, error: GenerationError) -> bytes: ...


async def encoded_answer(
    request: Request,
    steps: AsyncGenerator[Step, None],
    encoder: ChatEncoder,
    *,
    stream: bool,
    error: Callable[[GenerationError], Whole],
    media_type: str = SSE,
    headers: Mapping[str, str] | None = SSE_HEADERS,
) -> Prepared:
    """The answer of one prompt's `steps`: a document, or a stream (`media_type`: server-sent
    events unless told)."""
    if not stream:
        collected = await collect(request, steps)
        if collected is None:
            return CLIENT_GONE
        end = ended(collected)
        if isinstance(end, Failed):
            return error(end.error())
        return Whole(200, encoder.document(end), JSON)
    return await streamed(
        request,
        steps,
        ready=has_output,
        refuse=refused_with(error),
        chunks=partial(_events, encoder=encoder),
        media_type=media_type,
        headers=headers,
    )


async def _events(
    head: list[Step], rest: AsyncIterator[Step], encoder: ChatEncoder
) -> AsyncGenerator[Chunk, None]:
    yield Chunk(encoder.opening())
    async for step in chained(head, rest):
        for event in step:
            match event:
                case Delta():
                    data = encoder.chunk(event)
                    if data:
                        yield Chunk(data)
                case Finished():
                    yield Chunk(encoder.closing(event))
                    return
                case Failed():
                    yield Chunk(encoder.failure(event.error()), event.message)
                    return
