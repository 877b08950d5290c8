"""Several prompts at once, and continuation by request_id: a layer over the one engine path.

`BatchRunner.run` starts one `GenerationService.generate` per request, each in a task of its
own (so its admission slot is entered and left in one task), and yields, per wake-up, every
event the engine step produced for the payload, one Delta per prompt (a prompt's Deltas merge
while they wait for the consumer). A payload of one prompt keeps its task too: its
generation goes on to its end, and leaves its admission slot, while its client does not read
(issue 47 measured what iterating it in the consumer's task would save). With a continuation key
(the ordered request_ids, the specs' "internal caching"), known request_ids continue their
history, and every prompt that finishes leaves its whole sequence in the store before its
Finished event is delivered (a store that cannot take it turns that Finished into a Failed).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing

import msgspec

from gateway.edge.caller import current_caller
from gateway.engine.affinity import AFFINITY, affinity_key
from gateway.engine_path.generation import GenerationService, _duplicate, _failed
from gateway.stores.continuation import Claim, HistoryStore, Key
from protocols.errors import GenerationError, invalid
from protocols.events import TERMINAL, Delta, Event, Failed, Finished, History
from protocols.generation import GenerationRequest, PromptItem, SamplingOptions, sequences_asked
from protocols.names import Protocol


class BatchRunner:
    def __init__(self, service: GenerationService, store: HistoryStore) -> None:
        self.service = service
        self.store = store

    def run_prompts(
        self,
        items: Sequence[PromptItem],
        options: SamplingOptions,
        *,
        stream: bool,
        protocol: Protocol,
        adapter: str | None = None,
    ) -> AsyncGenerator[list[Event], None]:
        """A payload of the batch protocols: its request_ids, in order, are its key; its
        options are its `generation_config`'s, and so is its LoRA `adapter` (`adapter_id`)."""
        asked = sequences_asked("$.generation_config", num_beams=options.num_beams)
        requests = [
            GenerationRequest(
                options=options,
                prompt=item.prompt,
                request_id=item.request_id,
                index=i,
                stream=stream,
                asked=asked,
                adapter=adapter,
                adapter_field="$.generation_config.adapter_id",
            )
            for i, item in enumerate(items)
        ]
        return self.run(requests, protocol, key=tuple(item.request_id for item in items))

    def run(
        self, requests: Sequence[GenerationRequest], protocol: Protocol, *, key: Key | None = None
    ) -> AsyncGenerator[list[Event], None]:
        """`key` None: the prompts start afresh and leave no history behind. A key belongs to
        its caller's owner (its API key), so another key's same ids are another history.

        With a key, the payload's request_ids are claimed in the store before its history is
        read (a shared store refuses those another gateway is generating), and released at
        its end. A store that cannot be reached fails every prompt of the payload.
        """
        if key is None:
            return self._steps(requests, protocol, None, {}, frozenset())
        return self._keyed(requests, protocol, key)

    async def _keyed(
        self, requests: Sequence[GenerationRequest], protocol: Protocol, key: Key
    ) -> AsyncGenerator[list[Event], None]:
        owner = current_caller().owner
        key = (owner, *key)
        claim: Claim | None = None
        try:
            claim = await self.store.claim(owner, [r.request_id for r in requests if r.request_id])
            known = (await self.store.load(key)) or {}
        except GenerationError as e:
            if claim is not None:
                await claim.release()
            yield [self._refuse(r, protocol, e) for r in requests]
            return
        try:
            hits = sum(r.request_id in known for r in requests)
            self.service.metrics.continuation.labels("hit").inc(hits)
            self.service.metrics.continuation.labels("miss").inc(len(requests) - hits)
            async for step in self._steps(requests, protocol, key, known, claim.refused):
                yield step
        finally:
            await claim.release()

    async def _steps(
        self,
        requests: Sequence[GenerationRequest],
        protocol: Protocol,
        key: Key | None,
        known: dict[str, History],
        refused: frozenset[str],
    ) -> AsyncGenerator[list[Event], None]:
        histories = dict(known)
        queue: asyncio.Queue[Event] = asyncio.Queue()
        unread: dict[int, Delta] = {}  # each prompt's Delta still in the queue

        def put(event: Event) -> None:
            """A prompt's Delta joins the one still waiting in the queue, as vLLM's output
            collector does for one prompt: a consumer that falls behind (its client does not
            read) holds each prompt's text so far, never an event per step."""
            if isinstance(event, Delta):
                waiting = unread.get(event.index)
                if waiting is not None:
                    _merge(waiting, event)
                    return
                unread[event.index] = event
            queue.put_nowait(event)

        async def pump(request: GenerationRequest) -> None:
            rid = request.request_id
            if rid in refused:
                put(self._refuse(request, protocol, _duplicate(rid or "")))
                return
            if rid in known:
                made_with, asked = known[rid].adapter, self.service.adapter_of(request)
                if made_with != asked:  # a history continues on the model that made it
                    put(
                        self._refuse(
                            request, protocol, _other_adapter(rid or "", made_with, request)
                        )
                    )
                    return
                request = msgspec.structs.replace(request, history=known[rid])
            if key is not None:  # this task's own context: its engine requests only
                AFFINITY.set(affinity_key(key))
            async with aclosing(self.service.generate(request, protocol)) as events:
                async for event in events:
                    if isinstance(event, Finished) and event.history and key and rid is not None:
                        histories[rid] = event.history
                        try:
                            await self.store.save(key, dict(histories))
                        except GenerationError as e:  # its history is lost: say so
                            put(_failed(request.index, e))
                            continue
                    put(event)

        tasks = [asyncio.create_task(pump(r)) for r in requests]
        remaining = len(requests)
        try:
            while remaining:
                step = [await queue.get()]
                while not queue.empty():
                    step.append(queue.get_nowait())
                unread.clear()
                remaining -= sum(isinstance(e, TERMINAL) for e in step)
                yield step
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _refuse(
        self, request: GenerationRequest, protocol: Protocol, error: GenerationError
    ) -> Failed:
        """A prompt failed before it reached the engine path, counted as that path counts."""
        self.service.metrics.prompt_accepted(protocol).end(error.kind.value)
        return _failed(request.index, error)


def _other_adapter(
    request_id: str, made_with: str | None, request: GenerationRequest
) -> GenerationError:
    model = f"the adapter `{made_with}`" if made_with else "the base model"
    return invalid(
        f"request_id {request_id!r} was generated with {model}: continue it with the same "
        f"(or start a new request_id) - at `{request.adapter_field}`",
        request.adapter_field,
    )


def _merge(into: Delta, delta: Delta) -> None:
    """`delta` appended to `into`, an earlier Delta of the same prompt."""
    into.text += delta.text
    into.token_ids.extend(delta.token_ids)
    into.finish_reason = delta.finish_reason
    if into.tokens is not None and delta.tokens is not None:
        into.tokens.extend(delta.tokens)
