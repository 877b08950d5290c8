"""Ollama's model and embedding routes' shapes (no I/O): `/api/tags` (every model served),
`/api/ps` (those loaded), `/api/show`, `/api/version`, `/api/embed` and the older
`/api/embeddings`, as the `ollama` clients parse them (`ListResponse`, `ProcessResponse`,
`ShowResponse`, `EmbedResponse`, `EmbeddingsResponse`).

Nothing here downloads, copies or deletes a model: `/api/pull`, `/api/push`, `/api/create`,
`/api/copy` and `/api/delete` are refused saying so (`unserved`).
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta

from protocols.embedding import (
    MAX_DIMENSIONS,
    MAX_TOKENS,
    EmbeddingInput,
    EmbeddingRequest,
    Embeddings,
    check_dimensions,
    decode_text,
    decode_texts,
)
from protocols.errors import invalid
from protocols.ollama_requests import KeepAlive, model_name
from protocols.openai_requests import decode_body

MAX_INPUTS = 2048  # texts in one /api/embed request
VERSION = "0.12.0"  # the Ollama API release whose shapes these are
_ENCODER = msgspec.json.Encoder()
UNSERVED = {
    "pull": "nothing is downloaded",
    "push": "nothing is uploaded",
    "create": "models are configured in MODELS_FILE (docs/MODELS.md)",
    "copy": "models are configured in MODELS_FILE (docs/MODELS.md)",
    "delete": "models are configured in MODELS_FILE (docs/MODELS.md)",
}


def unserved(action: str) -> str:
    """Why `/api/<action>` is refused."""
    return (
        f"/api/{action} is not served by this gateway: {UNSERVED[action]}; GET /api/tags lists "
        "the models it serves"
    )


class OllamaDetails(msgspec.Struct, omit_defaults=True):
    format: str = "safetensors"
    family: str = ""
    families: list[str] | None = None
    parameter_size: str = ""
    quantization_level: str = ""
    parent_model: str = ""


class OllamaListed(msgspec.Struct):
    """One model of `/api/tags`; `size`: its engine's memory by the gateway's estimate, once
    known (0 before its first load)."""

    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: OllamaDetails


class OllamaTags(msgspec.Struct):
    models: list[OllamaListed]


class OllamaRunning(msgspec.Struct):
    """One loaded model of `/api/ps`: `expires_at` when its keep_alive unloads it (far ahead
    for one that stays)."""

    name: str
    model: str
    size: int
    digest: str
    details: OllamaDetails
    expires_at: str
    size_vram: int
    context_length: int


class OllamaPs(msgspec.Struct):
    models: list[OllamaRunning]


class OllamaShowRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    name: str | None = None  # the older clients' field
    verbose: bool = False


class OllamaShown(msgspec.Struct, kw_only=True):
    modelfile: str
    parameters: str
    template: str
    details: OllamaDetails
    model_info: dict[str, Any]
    capabilities: list[str]
    modified_at: str


class OllamaVersion(msgspec.Struct):
    version: str


def shown_model(raw: bytes) -> str:
    """`/api/show`'s model (`model`, or the older `name`)."""
    body: OllamaShowRequest = decode_body(raw, OllamaShowRequest)
    name = body.model or body.name
    if not name:
        raise invalid("`model` is required", "model")
    return model_name(name)


class OllamaEmbedOptions(msgspec.Struct, kw_only=True):
    num_ctx: Annotated[int, Meta(ge=1, le=MAX_TOKENS)] | None = None


class OllamaEmbedRequest(msgspec.Struct, kw_only=True):
    model: str
    input: Any = UNSET
    truncate: bool = True
    dimensions: Annotated[int, Meta(ge=1, le=MAX_DIMENSIONS)] | None = None
    options: OllamaEmbedOptions | None = None
    keep_alive: KeepAlive | None = None


class OllamaEmbeddingsRequest(msgspec.Struct, kw_only=True):
    model: str
    prompt: str = ""
    options: OllamaEmbedOptions | None = None
    keep_alive: KeepAlive | None = None


class OllamaEmbedded(msgspec.Struct):
    model: str
    embeddings: list[list[float]]
    total_duration: int
    load_duration: int
    prompt_eval_count: int


class OllamaEmbedding(msgspec.Struct):
    embedding: list[float]


def decode_embed(raw: bytes, *, dimensions_supported: bool) -> EmbeddingRequest:
    """`/api/embed`: `input` a string or strings; `truncate` (Ollama's default true) cuts an
    input past the model's length, false refuses it naming the input."""
    body: OllamaEmbedRequest = decode_body(raw, OllamaEmbedRequest)
    if isinstance(body.input, str) or body.input is UNSET:
        texts: tuple[str, ...] = (decode_text(body.input or "", "input"),)
        fields = ["input"]
    else:
        texts = decode_texts(body.input, "input", limit=MAX_INPUTS)
        fields = [f"input[{i}]" for i in range(len(texts))]
    check_dimensions(body.dimensions, dimensions_supported, "dimensions")
    return EmbeddingRequest(
        inputs=tuple(EmbeddingInput(f, text=t) for f, t in zip(fields, texts, strict=True)),
        model=model_name(body.model),
        truncate=body.truncate,
        dimensions=body.dimensions,
    )


def decode_embeddings(raw: bytes) -> EmbeddingRequest:
    """The older `/api/embeddings`: one `prompt`, cut to the model's length."""
    body: OllamaEmbeddingsRequest = decode_body(raw, OllamaEmbeddingsRequest)
    return EmbeddingRequest(
        inputs=(EmbeddingInput("prompt", text=body.prompt),),
        model=model_name(body.model),
        truncate=True,
    )


def encode_embedded(model: str, result: Embeddings, seconds: float) -> bytes:
    ns = round(seconds * 1e9)
    return _ENCODER.encode(OllamaEmbedded(model, result.vectors, ns, 0, result.prompt_tokens))


def encode_old_embedding(result: Embeddings) -> bytes:
    return _ENCODER.encode(OllamaEmbedding(result.vectors[0]))


def encode(value: msgspec.Struct) -> bytes:
    return _ENCODER.encode(value)


def details(family: str = "", dtype: str | None = None) -> OllamaDetails:
    return OllamaDetails(
        family=family, families=[family] if family else None, quantization_level=dtype or ""
    )


def digest_of(name: str) -> str:
    """A stable stand-in for Ollama's blob digest: the name's SHA-256."""
    return hashlib.sha256(name.encode()).hexdigest()
