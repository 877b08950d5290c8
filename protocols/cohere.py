"""Cohere's v2 API: POST `/v2/embed` and `/v2/rerank`, as the `cohere` SDK (7.x) sends them and
parses the answers (its `EmbedByTypeResponse` and `V2RerankResponse`); errors are Cohere's
`{"id", "message"}` at Cohere's statuses. Pure: no I/O.

`embedding_types`: `float` and `base64` (float32, little-endian) as computed; `int8`, `uint8`,
`binary` and `ubinary` are quantizations of the float vector: int8 `round(x * 127)` and uint8
`round((x + 1) * 127.5)`, clipped (a scale for normalized vectors, no calibration set), the
binary ones a bit per dimension (1 where x > 0, most significant bit first, eight to a byte),
signed `binary` less 128, as sentence-transformers' `quantize_embeddings` packs them.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Annotated, Any, Literal, assert_never

import msgspec
from msgspec import UNSET, Meta, UnsetType

from protocols import vllm_pooling
from protocols.embedding import (
    MAX_DIMENSIONS,
    MAX_TOKENS,
    Body,
    EmbeddingInput,
    EmbeddingRequest,
    Embeddings,
    EmptyInput,
    ScoreRequest,
    Scores,
    check_count,
    check_dimensions,
    decode_struct,
    decode_text,
    decode_texts,
    float32_base64,
)
from protocols.errors import ErrorKind, GenerationError, invalid
from protocols.generation import Priority

MAX_TEXTS = 96  # Cohere's: texts (or inputs) in one embed request
MAX_DOCUMENTS = 1000  # Cohere's advice for rerank; the caller may pass its own bound

EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]


class TextContent(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class EmbedInput(msgspec.Struct, kw_only=True):
    content: list[TextContent]


class EmbedBody(msgspec.Struct, kw_only=True):
    model: str | None = None
    input_type: str | None = None  # search_document, search_query...: accepted, no effect
    texts: Any = UNSET
    images: Any = UNSET
    inputs: list[EmbedInput] | UnsetType = UNSET
    max_tokens: Annotated[int, Meta(ge=1, le=MAX_TOKENS)] | None = None
    output_dimension: Annotated[int, Meta(ge=1, le=MAX_DIMENSIONS)] | None = None
    embedding_types: Annotated[list[EmbeddingType], Meta(min_length=1)] | None = None
    truncate: Literal["NONE", "START", "END"] | None = None  # None: END, Cohere's default
    priority: Priority | None = None


class CohereEmbedCall(msgspec.Struct, frozen=True):
    request: EmbeddingRequest
    embedding_types: tuple[EmbeddingType, ...]
    texts: tuple[str, ...]


def decode_embed(
    raw: Body, *, max_inputs: int = MAX_TEXTS, dimensions_supported: bool
) -> CohereEmbedCall:
    """POST `/v2/embed`: `texts`, or `inputs` of text content (images are refused)."""
    body = decode_struct(raw, EmbedBody)
    given = [f for f in ("texts", "images", "inputs") if getattr(body, f) is not UNSET]
    if len(given) != 1:
        raise invalid("Send exactly one of `texts`, `images` or `inputs`", "texts")
    if body.images is not UNSET:
        raise invalid("This model embeds text: send `texts` or `inputs`", "images")
    if body.texts is not UNSET:
        texts = decode_texts(body.texts, "texts", limit=max_inputs)
        fields = [f"texts[{i}]" for i in range(len(texts))]
    else:
        assert not isinstance(body.inputs, UnsetType)
        texts, fields = _input_texts(body.inputs, max_inputs)
    check_dimensions(body.output_dimension, dimensions_supported, "output_dimension")
    cut = body.truncate or "END"
    request = EmbeddingRequest(
        inputs=tuple(EmbeddingInput(f, text=t) for f, t in zip(fields, texts, strict=True)),
        model=body.model,
        truncate=cut != "NONE",
        side="left" if cut == "START" else "right",
        max_tokens=body.max_tokens if cut != "NONE" else None,
        dimensions=body.output_dimension,
        dimensions_field="output_dimension",
        priority=body.priority,
    )
    types: tuple[EmbeddingType, ...] = tuple(dict.fromkeys(body.embedding_types or ["float"]))
    return CohereEmbedCall(request, types, texts)


def _input_texts(inputs: list[EmbedInput], limit: int) -> tuple[tuple[str, ...], list[str]]:
    """Each input's text parts, joined by a line break."""
    if not inputs:
        raise EmptyInput("`inputs` cannot be empty", "inputs")
    check_count(len(inputs), limit, "inputs")
    texts = []
    for i, item in enumerate(inputs):
        parts = []
        for j, part in enumerate(item.content):
            where = f"inputs[{i}].content[{j}]"
            if part.type != "text":
                raise invalid("This model embeds text: only `text` content", f"{where}.type")
            parts.append(decode_text(part.text, f"{where}.text"))
        if not parts:
            raise EmptyInput(f"`inputs[{i}].content` cannot be empty", f"inputs[{i}].content")
        texts.append("\n".join(parts))
    return tuple(texts), [f"inputs[{i}]" for i in range(len(texts))]


def decode_rerank(raw: Body, *, max_inputs: int = MAX_DOCUMENTS) -> ScoreRequest:
    """POST `/v2/rerank`: Cohere's fields (`model`, `query`, `documents`, `top_n`,
    `max_tokens_per_doc`, `priority`) are vLLM's rerank request's, which this route takes too."""
    return vllm_pooling.decode_rerank(raw, max_inputs=max_inputs)


# --- Answers ------------------------------------------------------------------------------------


class ApiVersion(msgspec.Struct):
    version: str


class BilledUnits(msgspec.Struct, omit_defaults=True):
    input_tokens: int | None = None
    search_units: int | None = None


class ApiMeta(msgspec.Struct):
    api_version: ApiVersion
    billed_units: BilledUnits


class EmbeddingsByType(msgspec.Struct, omit_defaults=True, rename={"float_": "float"}):
    float_: list[list[float]] | None = None
    int8: list[list[int]] | None = None
    uint8: list[list[int]] | None = None
    binary: list[list[int]] | None = None
    ubinary: list[list[int]] | None = None
    base64: list[str] | None = None


class EmbedAnswer(msgspec.Struct):
    id: str
    embeddings: EmbeddingsByType
    texts: list[str]
    meta: ApiMeta
    response_type: str = "embeddings_by_type"


class RerankResult(msgspec.Struct):
    index: int
    relevance_score: float
    document: vllm_pooling.RerankDocument | UnsetType = UNSET


class RerankAnswer(msgspec.Struct):
    """Cohere's answer, with vLLM's `model` and `usage` beside it: `/v2/rerank` is vLLM's
    route too, and each client reads the fields it knows."""

    id: str
    results: list[RerankResult]
    meta: ApiMeta
    model: str
    usage: vllm_pooling.RerankUsage


class ErrorBody(msgspec.Struct):
    id: str
    message: str


_ENCODER = msgspec.json.Encoder()
_VERSION = ApiVersion("2")


def encode_embed(call: CohereEmbedCall, result: Embeddings) -> bytes:
    vectors = result.vectors
    by_type = EmbeddingsByType()
    for kind in call.embedding_types:
        match kind:
            case "float":
                by_type.float_ = vectors
            case "base64":
                by_type.base64 = [float32_base64(v) for v in vectors]
            case "int8":
                by_type.int8 = [[_clip(round(x * 127), -128, 127) for x in v] for v in vectors]
            case "uint8":
                by_type.uint8 = [
                    [_clip(round((x + 1) * 127.5), 0, 255) for x in v] for v in vectors
                ]
            case "binary":
                by_type.binary = [[b - 128 for b in packed_bits(v)] for v in vectors]
            case "ubinary":
                by_type.ubinary = [packed_bits(v) for v in vectors]
            case _:
                assert_never(kind)
    meta = ApiMeta(_VERSION, BilledUnits(input_tokens=result.prompt_tokens))
    return _ENCODER.encode(EmbedAnswer(_id(), by_type, list(call.texts), meta))


def encode_rerank(request: ScoreRequest, result: Scores, served: str) -> bytes:
    """The documents best first, the first `top_n`, each with its text as vLLM's answer has it
    (Cohere's SDK keeps unknown fields); one search unit billed, as Cohere counts a query."""
    vllm = vllm_pooling.rerank_answer(request, result, served)
    results = [RerankResult(r.index, r.relevance_score, r.document) for r in vllm.results]
    meta = ApiMeta(_VERSION, BilledUnits(search_units=1))
    return _ENCODER.encode(RerankAnswer(vllm.id, results, meta, vllm.model, vllm.usage))


def packed_bits(vector: Sequence[float]) -> list[int]:
    """A bit per dimension, 1 where positive, most significant first, the last byte padded."""
    out = []
    for start in range(0, len(vector), 8):
        byte = 0
        for i, x in enumerate(vector[start : start + 8]):
            if x > 0:
                byte |= 0x80 >> i
        out.append(byte)
    return out


def _clip(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def _status(kind: ErrorKind) -> int:
    """Cohere's status for each kind (the SDK raises its error class by status)."""
    match kind:
        case (
            ErrorKind.INVALID_REQUEST
            | ErrorKind.CONTEXT_LENGTH_EXCEEDED
            | ErrorKind.DUPLICATE_REQUEST_ID
        ):
            return 400
        case ErrorKind.UNPROCESSABLE:
            return 422
        case ErrorKind.RATE_LIMITED:
            return 429
        case ErrorKind.UNAUTHORIZED:
            return 401
        case ErrorKind.ENGINE_ERROR:
            return 500
        case ErrorKind.ENGINE_UNAVAILABLE:
            return 503
        case _:
            assert_never(kind)


def error_of(error: GenerationError) -> tuple[int, bytes]:
    """Cohere's status and `{"id", "message"}`; the message names the field."""
    message = error.message
    if error.field and f"`{error.field}`" not in message and " - at `" not in message:
        message = f"{message} (field `{error.field}`)"
    return _status(error.kind), _ENCODER.encode(ErrorBody(_id(), message))


def _id() -> str:
    return str(uuid.uuid4())
