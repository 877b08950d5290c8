"""vLLM's pooling routes: POST `/pooling`, `/score`, `/v1/score` and `/v1/rerank` (Jina's
shape; `/rerank` is gateway/routes/tei.py's, beside TEI's, and `/v2/rerank` Cohere's, beside
its embed), answered by the embedding model; a score is the cosine of the two texts'
embeddings, as vLLM's is for an embedding model. The shapes are protocols/vllm_pooling.py;
errors are OpenAI's error object, as vLLM's server answers them."""

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
from gateway.http.model_choice import named_model
from gateway.http.openapi import OPENAI_ERRORS, Op
from gateway.http.prepared import JSON, to_response
from gateway.state import gateway_of
from protocols import vllm_pooling
from protocols.embedding import Embeddings, ScoreRequest, TokenEmbeddings
from protocols.errors import GenerationError
from protocols.json_body import decode_json_object
from protocols.openai_answers import ErrorBody, error_of


async def pooling(request: Request) -> Response:
    try:
        doc = decode_json_object(await request.body())
    except GenerationError as e:
        return to_response(failure(e, error_of))

    def decode(supported: bool) -> vllm_pooling.PoolingCall:
        return vllm_pooling.decode_pooling(doc, dimensions_supported=supported)

    async def run(model: EmbeddingModel, call: vllm_pooling.PoolingCall) -> bytes:
        result: Embeddings | TokenEmbeddings
        if call.request.token_level:
            result = await model.embed_tokens(call.request)
        else:
            result = await model.embed(call.request)
        return await encoded(partial(vllm_pooling.encode_pooling, call, result, model.name), result)

    answer = await answered(gateway_of(request), named_model(doc), error_of, decode, run)
    return to_response(answer)


async def score(request: Request) -> Response:
    try:
        doc = decode_json_object(await request.body())
    except GenerationError as e:
        return to_response(failure(e, error_of))

    async def run(model: EmbeddingModel, asked: ScoreRequest) -> bytes:
        return vllm_pooling.encode_score(asked, await model.score(asked), model.name)

    decode = ignoring_dimensions(vllm_pooling.decode_score, doc)
    answer = await answered(gateway_of(request), named_model(doc), error_of, decode, run)
    return to_response(answer)


async def rerank(request: Request) -> Response:
    try:
        doc = decode_json_object(await request.body())
    except GenerationError as e:
        return to_response(failure(e, error_of))
    return to_response(await vllm_rerank(gateway_of(request), doc))


routes = [
    Route("/pooling", pooling, methods=["POST"]),
    Route("/score", score, methods=["POST"]),
    Route("/v1/score", score, methods=["POST"]),
    Route("/v1/rerank", rerank, methods=["POST"]),
]
operations = [
    Op(
        "post",
        "/pooling",
        "vLLM pooling: a vector per input, or per token",
        vllm_pooling.PoolingBody,
        {JSON: vllm_pooling.PoolingAnswer},
        ErrorBody,
        OPENAI_ERRORS,
    ),
    *(
        Op(
            "post",
            path,
            "vLLM score: the cosine of each pair's embeddings",
            vllm_pooling.ScoreBody,
            {JSON: vllm_pooling.ScoreAnswer},
            ErrorBody,
            OPENAI_ERRORS,
        )
        for path in ("/score", "/v1/score")
    ),
    Op(
        "post",
        "/v1/rerank",
        "vLLM (Jina) rerank",
        vllm_pooling.RerankBody,
        {JSON: vllm_pooling.RerankAnswer},
        ErrorBody,
        OPENAI_ERRORS,
    ),
]
