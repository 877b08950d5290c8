"""Which model a request names, for the routes of two tasks: the embedding routes of every
family (OpenAI's, TEI's, Cohere's, vLLM's) find the embedding model, and a request for the
other task (an embedding from the chat model, a chat to the embedding model) is refused
naming `model`, in the family's own shape, rather than answered 404."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.engine_path.embedding_model import EmbeddingModel
from gateway.state import Gateway
from protocols.errors import GenerationError, invalid
from protocols.openai_requests import ANY_MODEL


@dataclass(frozen=True)
class ModelRefused:
    """Why no embedding model answers: `status` 404 for a model not served, 400 for the chat
    model; `error` names `model`."""

    status: int
    error: GenerationError


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


def generation_refused(gateway: Gateway, asked: str | None) -> GenerationError | None:
    """A chat or completion naming an embedding model: refused naming `model`."""
    if asked is None or gateway.models.task_of(asked) != "embed":
        return None
    return invalid(
        f"The model `{asked}` embeds; it does not generate: ask `{gateway.model.name}`", "model"
    )


def named_model(doc: dict[str, object]) -> str | None:
    """A body's `model`, read before the body is decoded (which needs the model's limits);
    one not a string is refused by the decoding."""
    model = doc.get("model")
    return model if isinstance(model, str) else None
