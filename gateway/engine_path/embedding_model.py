"""`EmbeddingModel`: what routes may know and ask of the embedding model served beside the chat
model (docs/EMBEDDINGS.md): its name and task, whether it is ready, and protocols/embedding.py's
`EmbeddingRequest` answered with its engine's vectors.

Inputs are tokenized and cut here, so every family's truncation means the same: an input
longer than the model takes is cut at the side asked for (the special tokens kept) or refused
naming its field; `max_tokens` keeps at most that many tokens. A request with no priority is
`priority` (EMBEDDING_PRIORITY: bulk), so chats stay fast.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Literal

from gateway.engine.holder import EngineHolder
from gateway.engine.pooling_engine import PoolingEngine
from protocols.embedding import EmbeddingRequest, Embeddings, Side
from protocols.errors import ErrorKind, GenerationError, invalid
from protocols.openai_requests import check_token_ids

Task = Literal["embed"]


class EmbeddingModel:
    """The served embedding model: `name` as clients see it, `task` what it does (a registry
    holds models by both); everything else waits for the engine while it loads."""

    task: Task = "embed"

    def __init__(
        self, holder: EngineHolder[PoolingEngine], name: str, default_priority: int
    ) -> None:
        self._holder = holder
        self.name = name
        self.default_priority = default_priority

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
        return (await self._holder.wait()).matryoshka

    async def embed(self, request: EmbeddingRequest) -> Embeddings:
        """One vector per input, in order; `usage` the tokens embedded."""
        engine = await self._holder.wait()
        inputs = await self._token_ids(engine, request)
        vectors = await asyncio.gather(
            *(
                engine.pool(
                    ids,
                    normalize=request.normalize,
                    dimensions=request.dimensions,
                    priority=self._priority(request.priority),
                )
                for ids in inputs
            )
        )
        return Embeddings(list(vectors), sum(len(ids) for ids in inputs))

    def _priority(self, asked: int | None) -> int:
        return self.default_priority if asked is None else asked

    async def _token_ids(self, engine: PoolingEngine, request: EmbeddingRequest) -> list[list[int]]:
        if request.prompt_name is not None:
            raise invalid("This model has no prompts: leave out `prompt_name`", "prompt_name")
        texts = [i.text for i in request.inputs if i.text is not None]
        encoded = iter(await asyncio.to_thread(_encode_all, engine.tokenizer, texts))
        vocabulary = len(engine.tokenizer)
        limit = engine.max_model_len
        if request.max_tokens is not None:
            limit = min(limit, request.max_tokens)
        prefix, suffix = engine.special_prefix, engine.special_suffix
        special = len(prefix) + len(suffix)
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


def _encode_all(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Each text's tokens without the special tokens, which are added after any cut."""
    return [list(tokenizer.encode(t, add_special_tokens=False)) for t in texts]


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
