"""Text Embeddings Inference's own routes: POST `/embed`, `/embed_all`, `/similarity` and
`/rerank` (TEI's body, `texts`; or vLLM's and Jina's, `documents`), answered by the embedding
model. TEI's bodies on the paths the chat model's protocols share (`/`, `/invocations`,
`/tokenize`, `/info`) are answered by those routes, through gateway/http/embedding_answers.py.
The shapes are protocols/tei.py; errors are TEI's `{"error", "error_type"}`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.engine_path.embedding_model import EmbeddingModel
from gateway.http.embedding_answers import answered, failure, vllm_rerank
from gateway.http.openapi import Op
from gateway.http.prepared import JSON, to_response
from gateway.state import gateway_of
from protocols import tei, vllm_pooling
from protocols.errors import GenerationError
from protocols.json_body import decode_json_object
from protocols.openai_answers import ErrorBody


async def _answer(
    request: Request, work: Callable[[EmbeddingModel, bytes], Awaitable[bytes]]
) -> Response:
    raw = await request.body()

    async def run(model: EmbeddingModel) -> bytes:
        return await work(model, raw)

    return to_response(await answered(gateway_of(request), None, tei.error_of, run))


async def _embedded(model: EmbeddingModel, raw: bytes) -> bytes:
    supported = await model.dimensions_supported()
    return tei.encode_embed(
        await model.embed(tei.decode_embed(raw, dimensions_supported=supported))
    )


async def _token_embedded(model: EmbeddingModel, raw: bytes) -> bytes:
    return tei.encode_embed_all(await model.embed_tokens(tei.decode_embed_all(raw)))


async def _similar(model: EmbeddingModel, raw: bytes) -> bytes:
    return tei.encode_similarity(await model.embed(tei.decode_similarity(raw)))


async def _reranked(model: EmbeddingModel, raw: bytes) -> bytes:
    request = tei.decode_rerank(raw)
    return tei.encode_rerank(request, await model.score(request))


async def embed(request: Request) -> Response:
    return await _answer(request, _embedded)


async def embed_all(request: Request) -> Response:
    return await _answer(request, _token_embedded)


async def similarity(request: Request) -> Response:
    return await _answer(request, _similar)


async def rerank(request: Request) -> Response:
    """TEI's body (`texts`) answers in TEI's shape, vLLM's (`documents`) in vLLM's."""
    raw = await request.body()
    try:
        doc = decode_json_object(raw)
    except GenerationError as e:
        return to_response(failure(e, tei.error_of))
    if not tei.is_tei_rerank(doc):
        return to_response(await vllm_rerank(gateway_of(request), doc))
    return await _answer(request, _reranked)


routes = [
    Route("/embed", embed, methods=["POST"]),
    Route("/embed_all", embed_all, methods=["POST"]),
    Route("/similarity", similarity, methods=["POST"]),
    Route("/rerank", rerank, methods=["POST"]),
]
ERRORS = (400, 401, 404, 413, 422, 424, 429, 503)
operations = [
    Op(
        "post",
        "/embed",
        "TEI: embed",
        tei.EmbedBody,
        {JSON: list[list[float]]},
        tei.ErrorResponse,
        ERRORS,
    ),
    Op(
        "post",
        "/embed_all",
        "TEI: a vector per token",
        tei.EmbedAllBody,
        {JSON: list[list[list[float]]]},
        tei.ErrorResponse,
        ERRORS,
    ),
    Op(
        "post",
        "/similarity",
        "TEI: sentence similarity",
        tei.SimilarityBody,
        {JSON: list[float]},
        tei.ErrorResponse,
        ERRORS,
    ),
    Op(
        "post",
        "/rerank",
        "TEI's rerank (`texts`) or vLLM's (`documents`)",
        (tei.RerankBody, vllm_pooling.RerankBody),
        {JSON: (list[tei.Rank], vllm_pooling.RerankAnswer)},
        (tei.ErrorResponse, ErrorBody),
        ERRORS,
    ),
]
