"""Several prompts at once, and continuation by request_id: a layer over the one engine path.

`BatchRunner.run` starts one `GenerationService.generate` per request, each in a task of its
own (so its admission slot is entered and left in one task), and yields, per wake-up, every
event the engine step produced for the payload, one Delta per prompt. With a continuation key
(the ordered request_ids, the specs' "internal caching"), known request_ids continue their
history, and every prompt that finishes leaves its whole sequence in the store before its
Finished event is delivered.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing

import msgspec

from gateway.caller import current_caller
from gateway.continuation import ContinuationStore, Key
from gateway.generation import GenerationService
from protocols.generation import (
    TERMINAL,
    Delta,
    Event,
    Finished,
    GenerationRequest,
    PromptItem,
    SamplingOptions,
)
from protocols.names import Protocol


class BatchRunner:
    def __init__(self, service: GenerationService, store: ContinuationStore) -> None:
        self.service = service
        self.store = store

    def run_prompts(
        self,
        items: Sequence[PromptItem],
        options: SamplingOptions,
        *,
        stream: bool,
        protocol: Protocol,
    ) -> AsyncGenerator[list[Event], None]:
        """A payload of the batch protocols: its request_ids, in order, are its key."""
        requests = [
            GenerationRequest(
                options=options,
                prompt=item.prompt,
                request_id=item.request_id,
                index=i,
                stream=stream,
            )
            for i, item in enumerate(items)
        ]
        return self.run(requests, protocol, key=tuple(item.request_id for item in items))

    async def run(
        self, requests: Sequence[GenerationRequest], protocol: Protocol, *, key: Key | None = None
    ) -> AsyncGenerator[list[Event], None]:
        """`key` None: the prompts start afresh and leave no history behind. A key belongs to
        its caller's owner (its API key), so another key's same ids are another history."""
        if key is not None:
            key = (current_caller().owner, *key)
        known = (self.store.get(key) or {}) if key is not None else {}
        if key is not None:
            hits = sum(r.request_id in known for r in requests)
            self.service.metrics.continuation.labels("hit").inc(hits)
            self.service.metrics.continuation.labels("miss").inc(len(requests) - hits)
        histories = dict(known)
        queue: asyncio.Queue[Event] = asyncio.Queue()

        async def pump(request: GenerationRequest) -> None:
            rid = request.request_id
            if rid in known:
                request = msgspec.structs.replace(request, history=known[rid])
            async with aclosing(self.service.generate(request, protocol)) as events:
                async for event in events:
                    if isinstance(event, Finished) and event.history and key and rid is not None:
                        histories[rid] = event.history
                        self.store.put(key, histories)
                    queue.put_nowait(event)

        tasks = [asyncio.create_task(pump(r)) for r in requests]
        remaining = len(requests)
        try:
            while remaining:
                step = [await queue.get()]
                while not queue.empty():
                    step.append(queue.get_nowait())
                remaining -= sum(isinstance(e, TERMINAL) for e in step)
                yield merge_deltas(step)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def merge_deltas(step: list[Event]) -> list[Event]:
    """Keep one Delta per prompt in a step, so no frame holds two updates of one prompt."""
    if len(step) == 1:
        return step
    merged: list[Event] = []
    deltas: dict[int, Delta] = {}
    for event in step:
        if isinstance(event, Delta):
            previous = deltas.get(event.index)
            if previous is not None:
                previous.text += event.text
                previous.token_ids.extend(event.token_ids)
                previous.finish_reason = event.finish_reason
                if previous.tokens is not None and event.tokens is not None:
                    previous.tokens.extend(event.tokens)
                continue
            deltas[event.index] = event
        merged.append(event)
    return merged
