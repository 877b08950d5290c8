"""Several prompts at once, and continuation by request_id: a layer over the one engine path.

`BatchRunner.run` starts one `GenerationService.generate` per request, each in a task of its
own when there are several, and yields, per wake-up, every
event the engine step produced for the payload, one Delta per prompt (a prompt's Deltas merge
while they wait for the consumer). A payload of one prompt is iterated by its consumer while
the consumer keeps up, and handed to a task of its own once it does not
(gateway/engine_path/event_steps.py): its generation goes on to its end, and leaves its
admission slot, while its client does not read. With a continuation key
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
from gateway.engine_path.event_steps import StepQueue, relayed
from gateway.engine_path.generation import GenerationService, _duplicate, _failed
from gateway.observability.tracing import child, current_span
from gateway.stores.continuation import Claim, HistoryStore, Key
from protocols.errors import GenerationError, invalid
from protocols.events import TERMINAL, Event, Failed, Finished, History
from protocols.generation import GenerationRequest, PromptItem, SamplingOptions, sequences_asked
from protocols.names import Protocol


class BatchRunner:
    def __init__(
        self, service: GenerationService, store: HistoryStore, *, model: str | None = None
    ) -> None:
        """`model`: the chat model's name its histories are bound to (a history made on
        another model is not continued here)."""
        self.service = service
        self.store = store
        self.model = model

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
                model_field="X-Model",  # the batch protocols name a model only by the header
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
            with child(current_span(), "llm_gateway.continuation.load"):
                ids = [r.request_id for r in requests if r.request_id]
                claim = await self.store.claim(owner, ids)
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
            steps = self._steps(requests, protocol, key, known, claim.refused)
            async with aclosing(steps):
                async for step in steps:
                    yield step
        finally:
            await claim.release()

    def _steps(
        self,
        requests: Sequence[GenerationRequest],
        protocol: Protocol,
        key: Key | None,
        known: dict[str, History],
        refused: frozenset[str],
    ) -> AsyncGenerator[list[Event], None]:
        histories = dict(known)
        if len(requests) == 1:  # no task or queue while its consumer keeps up
            return relayed(self._one(requests[0], protocol, key, known, refused, histories))
        return self._tasks(requests, protocol, key, known, refused, histories)

    async def _tasks(
        self,
        requests: Sequence[GenerationRequest],
        protocol: Protocol,
        key: Key | None,
        known: dict[str, History],
        refused: frozenset[str],
        histories: dict[str, History],
    ) -> AsyncGenerator[list[Event], None]:
        """Each prompt in a task of its own, the steps through a StepQueue."""
        queue = StepQueue()

        async def pump(request: GenerationRequest) -> None:
            one = self._one(request, protocol, key, known, refused, histories)
            async with aclosing(one) as events:
                async for event in events:
                    queue.put(event)

        tasks = [asyncio.create_task(pump(r)) for r in requests]
        remaining = len(requests)
        try:
            while remaining:
                taken = await queue.take()
                assert taken is not None  # the prompts' tasks never end the queue
                step = taken
                remaining -= sum(isinstance(e, TERMINAL) for e in step)
                yield step
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _one(
        self,
        request: GenerationRequest,
        protocol: Protocol,
        key: Key | None,
        known: dict[str, History],
        refused: frozenset[str],
        histories: dict[str, History],
    ) -> AsyncGenerator[Event, None]:
        """One prompt's events; its Finished leaves the payload's `histories` (with this
        prompt's) in the store first. Its engine requests carry the key's affinity, set in
        the context of the task that starts it (its own, or the consumer's, which serves this
        payload only)."""
        rid = request.request_id
        if rid in refused:
            yield self._refuse(request, protocol, _duplicate(rid or ""))
            return
        if rid in known:
            made_on = known[rid].model
            if made_on is not None and self.model is not None and made_on != self.model:
                yield self._refuse(request, protocol, _other_model(rid or "", made_on, request))
                return
            made_with, asked = known[rid].adapter, self.service.adapter_of(request)
            if made_with != asked:  # a history continues on the model that made it
                yield self._refuse(request, protocol, _other_adapter(rid or "", made_with, request))
                return
            request = msgspec.structs.replace(request, history=known[rid])
        if key is not None:
            AFFINITY.set(affinity_key(key))
        async with aclosing(self.service.generate(request, protocol)) as events:
            async for event in events:
                if isinstance(event, Finished) and event.history and key and rid is not None:
                    history = event.history
                    if self.model is not None and history.model is None:
                        history.model = self.model
                    histories[rid] = history
                    try:
                        with child(current_span(), "llm_gateway.continuation.save"):
                            await self.store.save(key, dict(histories))
                    except GenerationError as e:  # its history is lost: say so
                        yield _failed(request.index, e)
                        continue
                yield event

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


def _other_model(request_id: str, made_on: str, request: GenerationRequest) -> GenerationError:
    return invalid(
        f"request_id {request_id!r} was generated on the model `{made_on}`: continue it on "
        f"the same (or start a new request_id) - at `{request.model_field}`",
        request.model_field,
    )
