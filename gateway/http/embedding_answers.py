"""Embedding answers that several route modules give: TEI's, on its own routes
(gateway/routes/tei.py) and on the paths it shares with the chat model's protocols (`/` with
TGI's generation, `/invocations` with LMI's, `/tokenize` with vLLM's, `/info` with TGI's),
where the body's shape picks (protocols/tei.py `is_tei_body`, docs/EMBEDDINGS.md); and vLLM's
rerank, served on `/rerank` beside TEI's and on `/v1/rerank`.

Each family answers in its own shape: `family.error_of` for a refusal, 404 for a model not
served (`model` named).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

from gateway.engine_path.embedding_model import EmbeddingModel, Piece
from gateway.http.model_choice import ModelRefused, embedding_model_for, named_model
from gateway.http.prepared import JSON, Whole
from gateway.observability.tracing import refused
from gateway.state import Gateway
from protocols import tei, vllm_pooling
from protocols.embedding import Body, EmbeddingRequest, Embeddings, ScoreRequest, TokenEmbeddings
from protocols.errors import GenerationError, invalid
from protocols.json_body import decode_json_object
from protocols.openai_answers import error_of as openai_error_of
from protocols.openai_answers import not_found

ErrorOf = Callable[[GenerationError], tuple[int, bytes]]
T = TypeVar("T")


# Encoding a few vectors costs less than the hop to a worker thread; a large answer (2,048
# vectors, or a vector per token: 43 MB of JSON for 32 inputs of /embed_all) is encoded in one,
# so the event loop serves everyone else meanwhile.
_ENCODE_INLINE_VECTORS = 64


async def encoded(encode: Callable[[], bytes], result: Embeddings | TokenEmbeddings) -> bytes:
    """`encode()`, the answer of `result`: inline when it holds few vectors, else off the loop."""
    vectors = result.prompt_tokens if isinstance(result, TokenEmbeddings) else len(result.vectors)
    if vectors <= _ENCODE_INLINE_VECTORS:
        return encode()
    return await asyncio.to_thread(encode)


def refusal(refused: ModelRefused, error_of: ErrorOf) -> Whole:
    """A family's answer to a model it cannot ask: its error body, 404 for a model not
    served (OpenAI's `model_not_found` where the family is OpenAI's)."""
    if refused.status == 404 and error_of is openai_error_of:
        return Whole(404, not_found(refused.error.message), JSON)
    status, body = error_of(refused.error)
    return Whole(refused.status if refused.status == 404 else status, body, JSON)


def failure(error: GenerationError, error_of: ErrorOf) -> Whole:
    refused(error)
    status, body = error_of(error)
    return Whole(status, body, JSON)


async def answered(
    gateway: Gateway,
    asked: str | None,
    error_of: ErrorOf,
    decode: Callable[[bool], T],
    run: Callable[[EmbeddingModel, T], Awaitable[bytes]],
) -> Whole:
    """`run`'s answer from the embedding model `asked` names (None: the served one) to the
    request `decode` reads (given whether the model takes `dimensions`), or the family's
    refusal: a bad field is named before a model not served."""
    model = embedding_model_for(gateway, asked)
    try:
        if isinstance(model, ModelRefused):
            decode(True)
            return refusal(model, error_of)
        call = decode(await model.dimensions_supported())
        return Whole(200, await run(model, call), JSON)
    except GenerationError as e:
        return failure(e, error_of)


# --- TEI -----------------------------------------------------------------------------------------


def tei_body_of(gateway: Gateway, raw: bytes) -> dict[str, Any] | None:
    """The body on `/` or `/invocations` when it is TEI's and an embedding model is served;
    None: the generation's route answers it (a body that is not JSON included)."""
    if gateway.models.embedding() is None:
        return None
    doc = _json_object(raw)
    return doc if doc is not None and tei.is_tei_body(doc) else None


def tei_tokenize_body_of(gateway: Gateway, raw: bytes) -> dict[str, Any] | None:
    """The body on `/tokenize` when it is TEI's (`inputs`) and an embedding model is served."""
    if gateway.models.embedding() is None:
        return None
    doc = _json_object(raw)
    return doc if doc is not None and tei.is_tei_tokenize(doc) else None


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        return decode_json_object(raw)
    except GenerationError:
        return None


async def embedding_invocation(gateway: Gateway, raw: bytes, target: str | None) -> Whole | None:
    """An invocation (`/invocations`, LMI's `/predictions/{model}`, SageMaker's) answered as
    TEI's SageMaker image answers it, when `target` (the path's model, SageMaker's
    TargetModel) names an embedding model, or names none and the body is TEI's; None: the
    chat model's generation answers it (a target that names no embedding model included)."""
    if target is not None and gateway.models.task_of(target) == "embed":
        try:
            doc = decode_json_object(raw)
        except GenerationError as e:
            return failure(e, tei.error_of)
        return await tei_invocation(gateway, doc, target)
    tei_body = tei_body_of(gateway, raw)
    return None if tei_body is None else await tei_invocation(gateway, tei_body)


async def tei_invocation(gateway: Gateway, doc: dict[str, Any], model: str | None = None) -> Whole:
    """TEI's body on `/` or `/invocations`: the task its shape asks for, from the embedding
    model `model` names (None: the first served)."""

    def decode(supported: bool) -> tuple[tei.Task, EmbeddingRequest | ScoreRequest]:
        return tei.decode_invocation(doc, dimensions_supported=supported)

    async def run(
        model: EmbeddingModel, call: tuple[tei.Task, EmbeddingRequest | ScoreRequest]
    ) -> bytes:
        task, request = call
        if isinstance(request, ScoreRequest):
            return tei.encode_rerank(request, await model.score(request))
        if task == "similarity":
            return tei.encode_similarity(await model.embed(request))
        vectors = await model.embed(request)
        return await encoded(partial(tei.encode_embed, vectors), vectors)

    return await answered(gateway, model, tei.error_of, decode, run)


async def tei_tokenize(gateway: Gateway, doc: dict[str, Any]) -> Whole:
    """TEI's POST `/tokenize`: each text's tokens, with the characters each covers."""

    def decode(_: bool) -> tei.TeiTokenize:
        asked = tei.decode_tokenize(doc)
        if asked.prompt_name is not None:
            raise invalid("This model has no prompts: leave out `prompt_name`", "prompt_name")
        return asked

    async def run(model: EmbeddingModel, asked: tei.TeiTokenize) -> bytes:
        pieces = [
            await model.tokens(text, special_tokens=asked.add_special_tokens)
            for text in asked.texts
        ]
        # TEI tokenizes a text whole, as vLLM's /tokenize does: 4 MiB of words are 700,000
        # tokens, whose answer (44 MB) is built off the event loop.
        return await asyncio.to_thread(_tokenize_answer, pieces)

    return await answered(gateway, None, tei.error_of, decode, run)


def _tokenize_answer(pieces: list[list[Piece]]) -> bytes:
    return tei.encode_tokenize(
        [
            [tei.SimpleToken(p.id, p.text, p.special, p.start, p.stop) for p in text]
            for text in pieces
        ]
    )


async def tei_info(gateway: Gateway, version: str, name: str) -> Whole:
    """TEI's GET `/info` of the embedding model `name`."""
    settings = gateway.settings

    async def run(model: EmbeddingModel, _: None) -> bytes:
        facts = await model.describe()
        info = tei.Info(
            model_id=facts.model_id,
            model_dtype=facts.dtype,
            served_model_name=model.name,
            model_type=tei.EmbeddingType(tei.EmbeddingModel(facts.pooling)),
            max_concurrent_requests=settings.max_running_requests + settings.max_waiting_requests,
            max_input_length=facts.max_input_length,
            max_batch_tokens=settings.embedding_max_num_batched_tokens,
            max_batch_requests=settings.embedding_max_num_seqs,
            version=version,
        )
        return tei.encode_info(info)

    return await answered(gateway, name, tei.error_of, lambda _: None, run)


# --- vLLM's rerank -------------------------------------------------------------------------------


async def vllm_rerank(gateway: Gateway, doc: dict[str, Any]) -> Whole:
    """vLLM's (Jina's) rerank body: `query` against `documents`, best first."""

    async def run(model: EmbeddingModel, request: ScoreRequest) -> bytes:
        return vllm_pooling.encode_rerank(request, await model.score(request), model.name)

    decode = ignoring_dimensions(vllm_pooling.decode_rerank, doc)
    return await answered(gateway, named_model(doc), openai_error_of, decode, run)


def ignoring_dimensions(decode: Callable[[Body], T], doc: Body) -> Callable[[bool], T]:
    """A decoder of a body with no `dimensions` (a score's, a tokenize's), as `answered` takes."""
    return lambda _: decode(doc)
