"""Which model a request names: the one place a name becomes a model, for every route.

A protocol's own field names the model (OpenAI's, Anthropic's and Cohere's `model`, LMI's
`/predictions/{model}`, the control protocol's `config.model`, ...). Where a protocol names
none, or names TGI's clients' any-model names, the `X-Model` header names it (a WebSocket's
`model` query parameter too, which a browser can set), else it is the default chat model.

A chat route gets its `ChatModel` (`chat_model_for`); the embedding routes of every family
(OpenAI's, TEI's, Cohere's, vLLM's) their embedding model (`embedding_model_for`). A request
for the other task (an embedding from a chat model, a chat to the embedding model) is refused
naming `model` (400), a name nothing serves is the family's 404, in the family's own shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
from starlette.requests import HTTPConnection

from gateway.engine_path.chat_model import ChatModel
from gateway.engine_path.embedding_model import EmbeddingModel
from gateway.observability.tracing import refused
from gateway.state import Gateway
from protocols.errors import GenerationError, invalid
from protocols.openai_requests import ANY_MODEL

MODEL_HEADER = "x-model"


@dataclass(frozen=True)
class ModelRefused:
    """Why no model answers: `status` 404 for a model not served, 400 for a model of the other
    task; `error` names `field`."""

    status: int
    error: GenerationError

    def __post_init__(self) -> None:
        refused(self.error)  # the request answered with it: its trace fails with its kind


class _Named(msgspec.Struct):
    model: str | None = None


_NAMED = msgspec.json.Decoder(_Named)


def body_model(raw: bytes) -> str | None:
    """A JSON body's `model`, read before the body is decoded (which needs the model's limits);
    a body that is not JSON, or a `model` not a string, is the decoding's to refuse."""
    try:
        return _NAMED.decode(raw).model
    except (msgspec.DecodeError, RecursionError, UnicodeError):
        return None


def named_model(doc: dict[str, object]) -> str | None:
    """A decoded body's `model` (one not a string is refused by the decoding)."""
    model = doc.get("model")
    return model if isinstance(model, str) else None


def asked_model(connection: HTTPConnection, named: str | None) -> str | None:
    """The model a request asks for: its protocol's own field (`named`) where it names one,
    else the X-Model header, else a WebSocket's `model` query parameter."""
    if named is not None and named not in ANY_MODEL:
        return named
    header = connection.headers.get(MODEL_HEADER)
    if header:
        return header
    if connection.scope["type"] == "websocket":
        return connection.query_params.get("model") or named
    return named


def chat_model_for(
    gateway: Gateway, asked: str | None, field: str = "model"
) -> ChatModel | ModelRefused:
    """The chat model `asked` names (None, or an any-model name: the default), or why not."""
    model = gateway.chats.find(asked)
    if model is not None:
        model.touch()
        return model
    assert asked is not None  # None is the default model
    if gateway.models.task_of(asked) == "embed":
        why = f"The model `{asked}` embeds; it does not generate: ask `{gateway.model.name}`"
        return ModelRefused(400, invalid(why, field))
    served = ", ".join(f"`{name}`" for name in gateway.chats.names())
    why = f"The model `{asked}` does not exist; this server serves {served}"
    return ModelRefused(404, invalid(why, field))


def embedding_model_for(gateway: Gateway, asked: str | None) -> EmbeddingModel | ModelRefused:
    """The embedding model a request's `model` names (None, or TGI's clients' any-model
    names: the first served), or why not."""
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
        return ModelRefused(400, invalid(why, "model"))
    if served is None:
        return ModelRefused(404, invalid("This server serves no embedding model", "model"))
    names = ", ".join(f"`{m.name}`" for m in models.embedding_models())
    why = f"The model `{asked}` does not exist; this server embeds with {names}"
    return ModelRefused(404, invalid(why, "model"))
