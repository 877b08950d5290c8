"""OpenAI's POST `/v1/embeddings`: the request decoded to the neutral EmbeddingRequest and the
answer OpenAI sends (`{object: "list", data: [{object: "embedding", index, embedding}], model,
usage}`), vectors as floats or as base64 of little-endian float32. Errors are OpenAI's error
object: `protocols.openai_answers.error_of`. Pure: no I/O.

Fields this server does not know are ignored, as OpenAI's and vLLM's servers do; vLLM's
extensions for the same route (`truncate_prompt_tokens`, `truncation_side`, `priority`) are
taken too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from protocols.embedding import (
    MAX_DIMENSIONS,
    MAX_TOKENS,
    Body,
    EmbeddingRequest,
    Embeddings,
    check_dimensions,
    decode_inputs,
    decode_struct,
    float32_base64,
)
from protocols.generation import Priority

MAX_INPUTS = 2048  # OpenAI's: inputs in one request

EncodingFormat = Literal["float", "base64"]


class EmbeddingsBody(msgspec.Struct, kw_only=True):
    input: Any  # decode_inputs reads it, naming `input[i]` in its errors
    model: str | None = None
    encoding_format: EncodingFormat | None = None
    dimensions: Annotated[int, Meta(ge=1, le=MAX_DIMENSIONS)] | None = None
    user: str | None = None
    # vLLM's extensions: -1 cuts at the model's length, n > 0 keeps n tokens
    truncate_prompt_tokens: Annotated[int, Meta(ge=-1, le=MAX_TOKENS)] | None = None
    truncation_side: Literal["left", "right"] | None = None
    priority: Priority | None = None


class OpenAIEmbeddingCall(msgspec.Struct, frozen=True):
    request: EmbeddingRequest
    encoding_format: EncodingFormat


def decode_embeddings(
    raw: Body, *, max_inputs: int = MAX_INPUTS, dimensions_supported: bool
) -> OpenAIEmbeddingCall:
    """An OpenAI embeddings request; `dimensions_supported`: the model serves shortened
    vectors (else `dimensions` is refused). Raises GenerationError naming the field."""
    body = decode_struct(raw, EmbeddingsBody)
    inputs = decode_inputs(body.input, "input", limit=max_inputs)
    check_dimensions(body.dimensions, dimensions_supported, "dimensions")
    cut = body.truncate_prompt_tokens
    request = EmbeddingRequest(
        inputs=inputs,
        model=body.model,
        truncate=cut is not None and cut != 0,
        side=body.truncation_side or "right",
        max_tokens=cut if cut is not None and cut > 0 else None,
        dimensions=body.dimensions,
        priority=body.priority,
    )
    return OpenAIEmbeddingCall(request, body.encoding_format or "float")


class EmbeddingData(msgspec.Struct):
    object: str
    index: int
    embedding: list[float] | str


class EmbeddingUsage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsAnswer(msgspec.Struct):
    object: str
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage


_ENCODER = msgspec.json.Encoder()


def encode_embeddings(call: OpenAIEmbeddingCall, result: Embeddings, served: str) -> bytes:
    """The answer; `served` names the model when the request named none."""
    base64 = call.encoding_format == "base64"
    data = [
        EmbeddingData("embedding", i, float32_base64(v) if base64 else v)
        for i, v in enumerate(result.vectors)
    ]
    usage = EmbeddingUsage(result.prompt_tokens, result.prompt_tokens)
    return _ENCODER.encode(EmbeddingsAnswer("list", data, call.request.model or served, usage))
