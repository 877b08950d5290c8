"""The Responses API's turns over the one engine path: a stored response, and the prompt of a
turn that continues one (`previous_response_id`).

A stored response keeps, beside the response object and its input items, the conversation so
far (every message, this turn's answer last, as the chat template receives them; never the
`instructions`, which OpenAI does not carry over) and the whole sequence of the turn as token
ids with their text in the template. The next turn renders its conversation (its own
instructions, the stored messages, its new input); when that text begins with the stored
sequence's text, its prompt is the stored token ids followed by the new text's tokens, so
vLLM's prefix cache finds every whole block of the history and only the new tokens cost
compute, as request_id continuation does for the seed protocols. A rendering that does not
begin so (other instructions, another adapter) is tokenized whole: still correct, the cache
then serves whatever prefix matches.

Stored responses live in the continuation store (gateway/stores/: in this process, or in Redis
with REDIS_URL), under its bounds and idle time, keyed by their owner (the caller's API key), so
another key does not find them.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.edge.caller import current_caller
from gateway.engine_path.served_model import ServedModel
from gateway.stores.continuation import HistoryStore, Key, packed_ids, unpacked_ids
from protocols.events import Finished, History, token_array
from protocols.generation import GenerationRequest
from protocols.responses_requests import ResponsesCall


class StoredResponse(msgspec.Struct, kw_only=True):
    response: bytes  # the response object (JSON) as GET answers it
    items: list[dict[str, Any]]  # its input items, as input_items lists them
    conversation: list[dict[str, Any]]  # every message so far, this turn's answer last
    token_ids: bytes  # the whole sequence (prompt and answer), int32 little-endian
    text: str  # those tokens' text in the chat template
    adapter: str | None = None
    model: str | None = None  # the chat model it was made on (None: made before there were several)


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(StoredResponse)


class Turn(msgspec.Struct, frozen=True):
    """A turn ready for the engine: its request, its `prompt` (the request's history: token
    ids, and their text in the chat template) and the conversation it continues (with its new
    messages)."""

    request: GenerationRequest
    prompt: History
    conversation: list[dict[str, Any]]


class Responses:
    """Stored responses, each private to its owner."""

    def __init__(self, store: HistoryStore, model: ServedModel) -> None:
        self.store = store
        self.model = model

    @staticmethod
    def _key(response_id: str) -> Key:
        return ("response", current_caller().owner, response_id)

    @staticmethod
    def events_key(response_id: str) -> Key:
        """Where a background response's events are kept (gateway/stores/event_log.py)."""
        return ("events", current_caller().owner, response_id)

    async def load(self, response_id: str) -> StoredResponse | None:
        raw = await self.store.load_document(self._key(response_id))
        return None if raw is None else _DECODER.decode(raw)

    async def delete(self, response_id: str) -> bool:
        return await self.store.delete_document(self._key(response_id))

    async def save(
        self,
        response_id: str,
        response: bytes,
        call: ResponsesCall,
        turn: Turn,
        done: Finished,
        answer: dict[str, Any],
    ) -> None:
        """The response, and what its next turn continues: the sequence after `done`."""
        generated = done.history.token_ids[len(turn.prompt.token_ids) :]
        text = turn.prompt.text + await self.model.decode(generated.tolist())
        stored = StoredResponse(
            response=response,
            items=list(call.items),
            conversation=[*turn.conversation, answer],
            token_ids=packed_ids(done.history.token_ids),
            text=text,
            adapter=done.history.adapter,
            model=self.model.name,
        )
        await self.store.save_document(self._key(response_id), _ENCODER.encode(stored))

    async def save_state(
        self, response_id: str, response: bytes, call: ResponsesCall, turn: Turn
    ) -> None:
        """A response that has no end yet, or ended without one (a background response queued,
        in progress, cancelled, ended by a shutdown): a turn that continues it continues its
        prompt."""
        stored = StoredResponse(
            response=response,
            items=list(call.items),
            conversation=list(turn.conversation),
            token_ids=packed_ids(turn.prompt.token_ids),
            text=turn.prompt.text,
            adapter=turn.request.adapter,
        )
        await self.store.save_document(self._key(response_id), _ENCODER.encode(stored))

    async def turn(self, call: ResponsesCall, previous: StoredResponse | None) -> Turn:
        """The turn's prompt: the previous response's token ids and the new text's, when the
        rendered conversation begins with the previous sequence's text."""
        conversation = [*(previous.conversation if previous else []), *call.messages]
        system = [{"role": "system", "content": call.instructions}] if call.instructions else []
        request = call.request
        rendered = await self.model.render_chat([*system, *conversation], tools=request.tools)
        adapter = await self.model.adapter_of(request.adapter, request.adapter_field)
        if (
            previous is not None
            and rendered.startswith(previous.text)
            and previous.adapter == adapter
        ):
            rest = rendered[len(previous.text) :]
            # without the special tokens the tokenizer adds at a text's start (a BOS): the
            # text follows tokens already there
            new = await self.model.tokenize(rest, special_tokens=False)
            ids = unpacked_ids(previous.token_ids) + token_array(new)
        else:
            ids = token_array(await self.model.tokenize(rendered))
        prompt = History(ids, rendered)
        return Turn(msgspec.structs.replace(request, history=prompt), prompt, conversation)
