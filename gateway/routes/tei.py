"""Text Embeddings Inference's own routes: POST `/embed`, `/embed_all`, `/similarity` and
`/rerank` (TEI's body, `texts`; or vLLM's and Jina's, `documents`), answered by the embedding
model. TEI's bodies on the paths the chat model's protocols share (`/`, `/invocations`,
`/tokenize`, `/info`) are answered by those routes, through gateway/http/embedding_answers.py.
The shapes are protocols/tei.py; errors are TEI's `{"error", "error_type"}`."""

from __future__ import annotations

from functools import partial

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.engine_path.embedding_model import EmbeddingModel
from gateway.http.embedding_answers import (
    answered,
    encoded,
    failure,
    ignoring_dimensions,
    vllm_rerank,
)
from gateway.http.openapi import Op
from gateway.http.prepared import JSON, to_response
from gateway.state import gateway_of
from protocols import tei, vllm_pooling
from protocols.embedding import EmbeddingRequest, ScoreRequest
from protocols.errors import GenerationError
from protocols.json_body import decode_json_object
from protocols.openai_answers import ErrorBody


async def embed(request: Request) -> Response:
    raw = await request.body()

    def decode(supported: bool) -> EmbeddingRequest:
        return tei.decode_embed(raw, dimensions_supported=supported)

    async def run(model: EmbeddingModel, asked: EmbeddingRequest) -> bytes:
        return tei.encode_embed(await model.embed(asked))

    return to_response(await answered(gateway_of(request), None, tei.error_of, decode, run))


async def embed_all(request: Request) -> Response:
    async def run(model: EmbeddingModel, asked: EmbeddingRequest) -> bytes:
        vectors = await model.embed_tokens(asked)
        return await encoded(partial(tei.encode_embed_all, vectors), vectors)

    decode = ignoring_dimensions(tei.decode_embed_all, await request.body())
    return to_response(await answered(gateway_of(request), None, tei.error_of, decode, run))


async def similarity(request: Request) -> Response:
    async def run(model: EmbeddingModel, asked: EmbeddingRequest) -> bytes:
        return tei.encode_similarity(await model.embed(asked))

    decode = ignoring_dimensions(tei.decode_similarity, await request.body())
    return to_response(await answered(gateway_of(request), None, tei.error_of, decode, run))


async def rerank(request: Request) -> Response:
    """TEI's body (`texts`) answers in TEI's shape, vLLM's (`documents`) in vLLM's."""
    try:
        doc = decode_json_object(await request.body())
    except GenerationError as e:
        return to_response(failure(e, tei.error_of))
    if not tei.is_tei_rerank(doc):
        return to_response(await vllm_rerank(gateway_of(request), doc))

    async def run(model: EmbeddingModel, asked: ScoreRequest) -> bytes:
        return tei.encode_rerank(asked, await model.score(asked))

    decode = ignoring_dimensions(tei.decode_rerank, doc)
    return to_response(await answered(gateway_of(request), None, tei.error_of, decode, run))


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
        "TEI: a vector per input",
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
