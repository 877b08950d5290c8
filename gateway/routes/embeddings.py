"""OpenAI's POST `/v1/embeddings`, answered by the embedding model served beside the chat model
(gateway/engine_path/embedding_model.py). The shapes are protocols/openai_embeddings.py; errors
are OpenAI's error object."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.engine_path.embedding_model import EmbeddingModel
from gateway.http.openapi import OPENAI_ERRORS, Op
from gateway.http.prepared import JSON, Prepared, Whole, to_response
from gateway.state import Gateway, gateway_of
from protocols.errors import GenerationError, invalid
from protocols.json_body import decode_json_object
from protocols.openai_answers import ErrorBody, error_of, not_found
from protocols.openai_embeddings import (
    EmbeddingsAnswer,
    EmbeddingsBody,
    decode_embeddings,
    encode_embeddings,
)
from protocols.openai_requests import ANY_MODEL


def model_for(gateway: Gateway, asked: str | None) -> EmbeddingModel | Whole:
    """The embedding model a request's `model` names (None: the first served), or OpenAI's
    answer: 404 for a model not served, 400 naming `model` for one that generates."""
    models = gateway.models
    named = None if asked is None or asked in ANY_MODEL else asked
    model = models.embedding(named)
    if model is not None:
        return model
    served = models.embedding()
    if asked is not None and models.task_of(asked) == "generate":
        why = f"The model `{asked}` generates text; it does not embed"
        if served is not None:
            why += f": ask `{served.name}`"
        return _error(invalid(why, "model"))
    if served is None:
        return Whole(404, not_found("This server serves no embedding model"), JSON)
    names = ", ".join(f"`{m.name}`" for m in models.embedding_models())
    why = f"The model `{asked}` does not exist; this server embeds with {names}"
    return Whole(404, not_found(why), JSON)


async def embeddings(request: Request) -> Response:
    return to_response(await _embedded(request))


async def _embedded(request: Request) -> Prepared:
    gateway = gateway_of(request)
    try:
        doc = decode_json_object(await request.body())
        model = model_for(gateway, _named(doc))
        if isinstance(model, Whole):
            decode_embeddings(doc, dimensions_supported=True)  # a bad field is named first
            return model
        call = decode_embeddings(doc, dimensions_supported=await model.dimensions_supported())
        result = await model.embed(call.request)
    except GenerationError as e:
        return _error(e)
    return Whole(200, encode_embeddings(call, result, model.name), JSON)


def _named(doc: dict[str, Any]) -> str | None:
    """The body's `model`, read before the body is decoded (which needs the model's limits);
    one not a string is refused by the decoding."""
    model = doc.get("model")
    return model if isinstance(model, str) else None


def _error(error: GenerationError) -> Whole:
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
