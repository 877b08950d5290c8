"""`EmbeddingModel`: what routes may know and ask of the embedding model served beside the chat
model (docs/EMBEDDINGS.md): its name and task, whether it is ready, and protocols/embedding.py's
`EmbeddingRequest` answered with its engine's vectors.

Inputs are tokenized and cut here, so every family's truncation means the same: an input
longer than the model takes is cut at the side asked for (the special tokens kept) or refused
naming its field, tokenized only as far as that needs (bounded_tokens.py); `max_tokens` keeps
at most that many tokens. Scores are a bi-encoder's: the cosine of the two texts' embeddings,
as vLLM's score does for an embedding model.

Every request goes through the chat model's admission (its bound on waiting work; one slot a
request) at its priority, `priority` (EMBEDDING_PRIORITY: bulk) when it names none, so chats
stay fast; and through the caller's limits: a request counts as a prompt, and the tokens it
embedded count towards the caller's tokens a minute. The model keeps at most two engine
batches of inputs in its engine at a time, across every request (input_window.py: 2 x
EMBEDDING_MAX_NUM_SEQS inputs, 2 x EMBEDDING_MAX_NUM_BATCHED_TOKENS tokens), each free place
to the caller with the fewest there, so another caller's embedding waits two batches, not one
caller's requests of 2,048 inputs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal, NamedTuple

from msgspec.structs import replace

from gateway.edge.caller import current_caller
from gateway.edge.limits import Limiter, RateLimited
from gateway.engine.holder import EngineHolder
from gateway.engine.pooling_engine import PoolingEngine
from gateway.engine_path.admission import Admission
from gateway.engine_path.bounded_tokens import bounded_encode
from gateway.engine_path.input_window import InputWindow
from gateway.engine_path.metrics import ModelMeter
from gateway.engine_path.traced_prompt import traced_embedding
from protocols.embedding import (
    EmbeddingInput,
    EmbeddingRequest,
    Embeddings,
    ScoreRequest,
    Scores,
    Side,
    TokenEmbeddings,
    cosine,
)
from protocols.errors import ErrorKind, GenerationError, invalid
from protocols.openai_requests import check_token_ids

Task = Literal["embed"]


class ModelFacts(NamedTuple):
    model_id: str  # the directory or hub id it was loaded from
    dtype: str  # float32, bfloat16...
    pooling: str  # mean, cls...
    max_input_length: int


class Piece(NamedTuple):
    """One token of a text: its id, its text, whether the tokenizer added it, and the
    characters it covers (None for an added special token)."""

    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


class EmbeddingModel:
    """The served embedding model: `name` as clients see it, `task` what it does (a registry
    holds models by both); everything else waits for the engine while it loads."""

    task: Task = "embed"

    def __init__(
        self,
        holder: EngineHolder[PoolingEngine],
        name: str,
        default_priority: int,
        admission: Admission,
        limiter: Limiter,
        meter: ModelMeter,
        max_token_vectors: int,
        max_in_flight: int,
        max_tokens_in_flight: int,
    ) -> None:
        self._holder = holder
        self.name = name
        self.default_priority = default_priority
        self._admission = admission
        self._limiter = limiter  # the chat path's: one key's limits count both
        self._meter = meter
        # A token-level answer holds a vector per token: bounded, as the engine's batch is
        self._max_token_vectors = max_token_vectors
        # The model's inputs in the engine at once, whoever sent them
        self.window = InputWindow(max_in_flight, max_tokens_in_flight)
        self.window.on_entry.append(meter.entered)

    @property
    def ready(self) -> bool:
        return self._holder.ready

    def status(self) -> tuple[str, str | None]:
        """(status, error): loading (also while it is rebuilt), ready or failed."""
        return self._holder.describe()

    def context_length(self) -> int | None:
        """The longest input in tokens, None before the engine was built."""
        engine = self._holder.engine
        return engine.max_model_len if engine is not None else None

    async def dimensions_supported(self) -> bool:
        """Whether the model serves shortened vectors (Matryoshka): `dimensions` else refused."""
        return (await self._holder.wait(through_rebuilds=False)).matryoshka

    async def describe(self) -> ModelFacts:
        """What TEI's /info reports of the model."""
        engine = await self._holder.wait(through_rebuilds=False)
        return ModelFacts(engine.model_id, engine.dtype, engine.pooling, engine.max_model_len)

    async def tokens(self, text: str, *, special_tokens: bool = True) -> list[Piece]:
        """`text`'s tokens with the characters each covers (TEI's /tokenize): an added special
        token covers none."""
        engine = await self._holder.wait(through_rebuilds=False)
        return await asyncio.to_thread(_pieces, engine.tokenizer, text, special_tokens)

    async def embed(self, request: EmbeddingRequest) -> Embeddings:
        """One vector per input, in order; `usage` the tokens embedded."""
        vectors, tokens = await self._pooled(request)
        return Embeddings(vectors, tokens)

    async def embed_tokens(self, request: EmbeddingRequest) -> TokenEmbeddings:
        """For each input, a vector per token (TEI's /embed_all, vLLM's `token_embed`)."""
        vectors, tokens = await self._pooled(request)
        return TokenEmbeddings(vectors, tokens)

    async def score(self, request: ScoreRequest) -> Scores:
        """Each pair's cosine of its two texts' embeddings, in the documents' order."""
        queries = [
            EmbeddingInput(_field(request.query_field, i, len(request.queries)), text=q)
            for i, q in enumerate(request.queries)
        ]
        documents = [
            EmbeddingInput(f"{request.documents_field}[{i}]", text=d)
            for i, d in enumerate(request.documents)
        ]
        common = EmbeddingRequest(
            inputs=tuple(queries), truncate=request.truncate, side=request.side
        )
        vectors, tokens = await self._pooled(
            common,
            # `max_tokens_per_doc` cuts the documents only, as vLLM's does
            replace(common, inputs=tuple(documents), max_tokens=request.max_tokens_per_doc),
            priority=request.priority,
        )
        query_vectors, document_vectors = vectors[: len(queries)], vectors[len(queries) :]
        if len(query_vectors) == 1:
            scores = [cosine(query_vectors[0], d) for d in document_vectors]
        else:
            scores = [cosine(q, d) for q, d in zip(query_vectors, document_vectors, strict=True)]
        return Scores(scores, tokens)

    async def _pooled(
        self, *requests: EmbeddingRequest, priority: int | None = None
    ) -> tuple[list[Any], int]:
        """Every request's inputs' pooled outputs, in order, and the tokens embedded: as one
        request within the caller's limits and through admission (at the first request's
        priority, or `priority`)."""
        priority = self._priority(priority if priority is not None else requests[0].priority)
        start, outcome, inputs, tokens = time.perf_counter(), "cancelled", 0, 0
        caller = current_caller()
        traced = traced_embedding(self.name, sum(len(r.inputs) for r in requests), caller.name)
        try:
            async with self._limited() as count:
                engine = await self._holder.wait(through_rebuilds=False)
                work = [(r, ids) for r in requests for ids in await self._token_ids(engine, r)]
                self._check_token_vectors(requests[0], sum(len(ids) for _, ids in work))
                span = traced.span if traced is not None else None
                async with self._admission.slot(priority, caller.id, span):
                    vectors = await self._pool_all(engine, work, priority)
                inputs, tokens = len(work), sum(len(ids) for _, ids in work)
                count(tokens)
            outcome = "ok"
            if traced is not None:
                traced.embedded(tokens)
        except GenerationError as e:
            outcome = e.kind
            if traced is not None:
                traced.failed(e.kind, e.message)
            raise
        finally:
            self._meter.ended(outcome, inputs, tokens, time.perf_counter() - start)
            if traced is not None:
                traced.end()
        return list(vectors), tokens

    @asynccontextmanager
    async def _limited(self) -> AsyncIterator[Any]:
        """The caller's limits around one request: refused (RATE_LIMITED, with its retry time)
        when over; the tokens the block reports count towards the caller's minute."""
        caller = current_caller()
        try:
            self._limiter.acquire(caller.id, caller.limits)
        except RateLimited as e:
            caller.retry_after = e.retry_after
            raise
        embedded = [0]

        def count(tokens: int) -> None:
            embedded[0] = tokens

        try:
            yield count
        finally:
            self._limiter.release(caller.id, caller.limits, embedded[0])

    async def _pool_all(
        self, engine: PoolingEngine, work: list[tuple[EmbeddingRequest, list[int]]], priority: int
    ) -> list[Any]:
        """Each input pooled, in order, each taking its place in the model's window (two engine
        batches: one running, the next queued, so the engine never waits for the window). The
        engine serves requests of one priority in their order of arrival: 2,048 inputs queued
        at once would keep every other caller's embeddings behind all of them; the window lets
        theirs in after two batches."""
        caller, turn = current_caller().id, object()  # this request's inputs take turns

        async def pooled(request: EmbeddingRequest, ids: list[int]) -> Any:
            async with self.window.entry(caller, turn, len(ids)):
                return await engine.pool(
                    ids,
                    token_level=request.token_level,
                    normalize=request.normalize,
                    dimensions=request.dimensions,
                    priority=priority,
                )

        return list(await asyncio.gather(*(pooled(r, ids) for r, ids in work)))

    def _check_token_vectors(self, request: EmbeddingRequest, tokens: int) -> None:
        """A vector per token past EMBEDDING_MAX_NUM_BATCHED_TOKENS is refused naming the
        inputs: 2,048 inputs of 256 tokens would be half a billion floats, gigabytes of lists
        and of JSON."""
        if request.token_level and tokens > self._max_token_vectors:
            field = request.inputs[0].field.split("[", 1)[0]
            raise invalid(
                f"`{field}` has {tokens} tokens, and a vector per token is asked for; at most "
                f"{self._max_token_vectors} a request (EMBEDDING_MAX_NUM_BATCHED_TOKENS): send "
                "fewer or shorter inputs",
                field,
            )

    def _priority(self, asked: int | None) -> int:
        return self.default_priority if asked is None else asked

    async def _token_ids(self, engine: PoolingEngine, request: EmbeddingRequest) -> list[list[int]]:
        if request.prompt_name is not None:
            raise invalid("This model has no prompts: leave out `prompt_name`", "prompt_name")
        vocabulary = len(engine.tokenizer)
        limit = engine.max_model_len
        if request.max_tokens is not None:
            limit = min(limit, request.max_tokens)
        prefix, suffix = engine.special_prefix, engine.special_suffix
        special = len(prefix) + len(suffix)
        texts = [i.text for i in request.inputs if i.text is not None]
        room = max(limit - special, 0)
        encoded = iter(
            await asyncio.to_thread(_encode_all, engine.tokenizer, texts, room, request.side)
        )
        inputs = []
        for item in request.inputs:
            if item.token_ids is not None:
                check_token_ids(item.token_ids, vocabulary, item.field)
                ids = list(item.token_ids)
                if len(ids) > limit:
                    ids = _check_length(ids, limit, request, item.field)
            else:
                body = next(encoded)
                if len(body) + special > limit:
                    body = _check_length(body, max(limit - special, 0), request, item.field)
                ids = [*prefix, *body, *suffix]
            inputs.append(ids)
        return inputs


def _pieces(tokenizer: Any, text: str, special_tokens: bool) -> list[Piece]:
    encoded = tokenizer(text, add_special_tokens=special_tokens, return_offsets_mapping=True)
    ids: list[int] = list(encoded["input_ids"])
    special = set(tokenizer.all_special_ids)
    names = tokenizer.convert_ids_to_tokens(ids)
    pieces = []
    for token, name, (start, stop) in zip(ids, names, encoded["offset_mapping"], strict=True):
        if token in special and start == stop:
            pieces.append(Piece(token, name, True, None, None))
        else:
            pieces.append(Piece(token, text[start:stop], False, start, stop))
    return pieces


def _encode_all(tokenizer: Any, texts: Sequence[str], room: int, side: Side) -> list[list[int]]:
    """Each text's tokens without the special tokens, which are added after any cut; a text
    with more than `room` tokens is tokenized only as far as its cut at `side` needs."""
    return [bounded_encode(tokenizer, t, room, side) for t in texts]


def _check_length(ids: list[int], limit: int, request: EmbeddingRequest, field: str) -> list[int]:
    """`ids` cut to `limit` at the request's side where it truncates; refused otherwise."""
    if not request.truncates:
        raise GenerationError(
            ErrorKind.CONTEXT_LENGTH_EXCEEDED,
            f"`{field}` has more tokens than this model takes ({limit}); ask for truncation "
            "or send a shorter text",
            field,
        )
    return _cut(ids, limit, request.side)


def _cut(ids: list[int], limit: int, side: Side) -> list[int]:
    if limit <= 0:
        return []
    return ids[-limit:] if side == "left" else ids[:limit]


def _field(field: str, i: int, count: int) -> str:
    return field if count == 1 else f"{field}[{i}]"
