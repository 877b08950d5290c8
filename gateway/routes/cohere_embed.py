"""Cohere's v2 POST `/v2/embed` and `/v2/rerank` (also vLLM's rerank route: its fields are
taken and its answer's fields sent too), answered by the embedding model. The shapes are
protocols/cohere.py; errors are Cohere's `{"id", "message"}`."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.engine_path.embedding_model import EmbeddingModel
from gateway.http.embedding_answers import answered, failure, ignoring_dimensions
from gateway.http.model_choice import named_model
from gateway.http.openapi import Op
from gateway.http.prepared import JSON, to_response
from gateway.state import gateway_of
from protocols import cohere, vllm_pooling
from protocols.embedding import ScoreRequest
from protocols.errors import GenerationError
from protocols.json_body import decode_json_object


async def embed(request: Request) -> Response:
    try:
        doc = decode_json_object(await request.body())
    except GenerationError as e:
        return to_response(failure(e, cohere.error_of))

    def decode(supported: bool) -> cohere.CohereEmbedCall:
        return cohere.decode_embed(doc, dimensions_supported=supported)

    async def run(model: EmbeddingModel, call: cohere.CohereEmbedCall) -> bytes:
        return cohere.encode_embed(call, await model.embed(call.request))

    answer = await answered(gateway_of(request), named_model(doc), cohere.error_of, decode, run)
    return to_response(answer)


async def rerank(request: Request) -> Response:
    try:
        doc = decode_json_object(await request.body())
    except GenerationError as e:
        return to_response(failure(e, cohere.error_of))

    async def run(model: EmbeddingModel, asked: ScoreRequest) -> bytes:
        return cohere.encode_rerank(asked, await model.score(asked), model.name)

    decode = ignoring_dimensions(cohere.decode_rerank, doc)
    answer = await answered(gateway_of(request), named_model(doc), cohere.error_of, decode, run)
    return to_response(answer)


routes = [
    Route("/v2/embed", embed, methods=["POST"]),
    Route("/v2/rerank", rerank, methods=["POST"]),
]
ERRORS = (400, 401, 404, 413, 422, 429, 500, 503)
operations = [
    Op(
        "post",
        "/v2/embed",
        "Cohere v2 embed",
        cohere.EmbedBody,
        {JSON: cohere.EmbedAnswer},
        cohere.ErrorBody,
        ERRORS,
    ),
    Op(
        "post",
        "/v2/rerank",
        "Cohere v2 rerank (and vLLM's)",
        vllm_pooling.RerankBody,
        {JSON: cohere.RerankAnswer},
        cohere.ErrorBody,
        ERRORS,
    ),
]
