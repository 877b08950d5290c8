"""OpenAI's POST `/v1/embeddings`, answered by the embedding model served beside the chat model
(gateway/engine_path/embedding_model.py). The shapes are protocols/openai_embeddings.py; errors
are OpenAI's error object."""

from __future__ import annotations

from functools import partial

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.http.embedding_answers import encoded
from gateway.http.model_choice import ModelRefused, embedding_model_for, named_model
from gateway.http.openapi import OPENAI_ERRORS, Op
from gateway.http.prepared import JSON, Prepared, Whole, to_response
from gateway.observability.tracing import refused
from gateway.state import gateway_of
from protocols.errors import GenerationError
from protocols.json_body import decode_json_object
from protocols.openai_answers import ErrorBody, error_of, not_found
from protocols.openai_embeddings import (
    EmbeddingsAnswer,
    EmbeddingsBody,
    decode_embeddings,
    encode_embeddings,
)


async def embeddings(request: Request) -> Response:
    return to_response(await _embedded(request))


async def _embedded(request: Request) -> Prepared:
    gateway = gateway_of(request)
    try:
        doc = decode_json_object(await request.body())
        model = embedding_model_for(gateway, named_model(doc))
        if isinstance(model, ModelRefused):
            decode_embeddings(doc, dimensions_supported=True)  # a bad field is named first
            return _refused(model)
        call = decode_embeddings(doc, dimensions_supported=await model.dimensions_supported())
        result = await model.embed(call.request)
    except GenerationError as e:
        return _error(e)
    body = await encoded(partial(encode_embeddings, call, result, model.name), result)
    return Whole(200, body, JSON)


def _refused(refused: ModelRefused) -> Whole:
    if refused.status == 404:
        return Whole(404, not_found(refused.error.message), JSON)
    return _error(refused.error)


def _error(error: GenerationError) -> Whole:
    refused(error)
    status, body = error_of(error)
    return Whole(status, body, JSON)


routes = [Route("/v1/embeddings", embeddings, methods=["POST"])]
operations = [
    Op(
        "post",
        "/v1/embeddings",
        "OpenAI embeddings, from the embedding model",
        EmbeddingsBody,
        {JSON: EmbeddingsAnswer},
        ErrorBody,
        OPENAI_ERRORS,
    ),
]
