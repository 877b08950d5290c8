"""vLLM's own pooling routes, as vLLM 0.32's server shapes them
(vllm/entrypoints/pooling/{pooling,scoring}/protocol.py): POST `/pooling`, `/score` and
`/v1/score` (text pairs), `/rerank` and `/v1/rerank` (Jina's rerank shape). Errors are OpenAI's
error object (`protocols.openai_answers.error_of`), as vLLM's server answers them. Cohere's
`/v2/rerank` takes this request too (protocols/cohere.py). Pure: no I/O.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from protocols.embedding import (
    MAX_DIMENSIONS,
    MAX_TOKENS,
    MAX_TOP_N,
    Body,
    EmbeddingRequest,
    Embeddings,
    EmptyInput,
    ScoreRequest,
    Scores,
    TokenEmbeddings,
    check_count,
    check_dimensions,
    decode_inputs,
    decode_struct,
    decode_text,
    float32_base64,
    ranked,
)
from protocols.errors import invalid
from protocols.generation import Priority

MAX_INPUTS = 2048  # inputs (or documents, or pairs) in one request: OpenAI's embeddings limit

EncodingFormat = Literal["float", "base64"]


class _Common(msgspec.Struct, kw_only=True):
    """PoolingBasicRequestMixin's fields this server honours (the rest are ignored)."""

    model: str | None = None
    user: str | None = None
    truncate_prompt_tokens: Annotated[int, Meta(ge=-1, le=MAX_TOKENS)] | None = None
    truncation_side: Literal["left", "right"] | None = None
    priority: Priority | None = None


class PoolingBody(_Common, kw_only=True):
    input: Any = UNSET  # absent: vLLM's chat form (`messages`), not served
    messages: Any = None
    task: Literal["embed", "token_embed", "classify", "token_classify", "plugin"] | None = None
    encoding_format: EncodingFormat = "float"
    dimensions: Annotated[int, Meta(ge=1, le=MAX_DIMENSIONS)] | None = None
    use_activation: bool | None = None  # embed: normalize
    normalize: Any = None  # removed by vLLM: refused naming it, as vLLM does


class PoolingCall(msgspec.Struct, frozen=True):
    request: EmbeddingRequest
    encoding_format: EncodingFormat


# (first, second) field names vLLM's ScoreRequest takes, in the order it tries them.
SCORE_PAIRS = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"))


class ScoreBody(_Common, kw_only=True):
    text_1: Any = UNSET
    text_2: Any = UNSET
    queries: Any = UNSET
    documents: Any = UNSET
    items: Any = UNSET
    data_1: Any = UNSET
    data_2: Any = UNSET
    max_tokens_per_doc: Annotated[int, Meta(ge=0, le=MAX_TOKENS)] = 0


class RerankBody(_Common, kw_only=True):
    query: Any
    documents: Any
    top_n: Annotated[int, Meta(ge=0, le=MAX_TOP_N)] | None = (
        0  # 0 (vLLM's) or null (Cohere's): every one
    )
    return_documents: bool = True  # Jina's; vLLM always returns them
    max_tokens_per_doc: Annotated[int, Meta(ge=0, le=MAX_TOKENS)] | None = 0


def decode_pooling(
    raw: Body, *, max_inputs: int = MAX_INPUTS, dimensions_supported: bool
) -> PoolingCall:
    """POST `/pooling`: `task` embed (one vector per input, the default) or token_embed (one
    per token); the classify tasks and the chat form are refused naming their field."""
    body = decode_struct(raw, PoolingBody)
    if body.normalize is not None:
        raise invalid(
            "Parameter `normalize` was removed; use `use_activation` instead.", "normalize"
        )
    if body.task not in (None, "embed", "token_embed"):
        raise invalid(f"This server pools for `embed` and `token_embed`, not `{body.task}`", "task")
    if body.input is UNSET:
        field = "messages" if body.messages is not None else "input"
        raise invalid("Send `input`: this server embeds texts and token ids", field)
    check_dimensions(body.dimensions, dimensions_supported, "dimensions")
    request = msgspec.structs.replace(
        _request(body, decode_inputs(body.input, "input", limit=max_inputs)),
        normalize=body.use_activation,
        dimensions=body.dimensions,
        token_level=body.task == "token_embed",
    )
    return PoolingCall(request, body.encoding_format)


def decode_score(raw: Body, *, max_inputs: int = MAX_INPUTS) -> ScoreRequest:
    """POST `/score`: `text_1` against `text_2` (or `queries` and `documents` / `items`, or
    `data_1` and `data_2`), each a string or a list of strings, 1:1, 1:N or N:N."""
    body = decode_struct(raw, ScoreBody)
    first, second = "text_1", "text_2"
    for a, b in SCORE_PAIRS:
        if getattr(body, a) is not UNSET and getattr(body, b) is not UNSET:
            first, second = a, b
            break
    left = _score_side(getattr(body, first), first, max_inputs)
    right = _score_side(getattr(body, second), second, max_inputs)
    if len(left) > 1 and len(left) != len(right):
        raise invalid("Input lengths must be either 1:1, 1:N or N:N", second)
    return _scoring(body, left, right, first, second, body.max_tokens_per_doc)


def decode_rerank(raw: Body, *, max_inputs: int = MAX_INPUTS) -> ScoreRequest:
    """POST `/rerank`, `/v1/rerank` and `/v2/rerank`: `query` against each of `documents`,
    best first, the first `top_n` (0 or null: all)."""
    body = decode_struct(raw, RerankBody)
    query = decode_text(body.query, "query")
    documents = _score_side(body.documents, "documents", max_inputs)
    request = _scoring(body, (query,), documents, "query", "documents", body.max_tokens_per_doc)
    return msgspec.structs.replace(
        request, top_n=body.top_n or None, return_documents=body.return_documents
    )


def _request(body: _Common, inputs: Any) -> EmbeddingRequest:
    cut = body.truncate_prompt_tokens
    return EmbeddingRequest(
        inputs=inputs,
        model=body.model,
        truncate=cut is not None and cut != 0,
        side=body.truncation_side or "right",
        max_tokens=cut if cut is not None and cut > 0 else None,
        priority=body.priority,
    )


def _score_side(value: Any, field: str, limit: int) -> tuple[str, ...]:
    if value is UNSET:
        raise invalid(f"Object missing required field `{field}`", field)
    if isinstance(value, str):
        return (decode_text(value, field),)
    if not isinstance(value, list):
        raise invalid(f"`{field}` must be a string or a list of strings", field)
    if not value:
        raise EmptyInput(f"`{field}` cannot be empty", field)
    check_count(len(value), limit, field)
    texts = []
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise invalid("This server scores texts only", f"{field}[{i}]")
        texts.append(decode_text(item, f"{field}[{i}]"))
    return tuple(texts)


def _scoring(
    body: _Common,
    queries: tuple[str, ...],
    documents: tuple[str, ...],
    query_field: str,
    documents_field: str,
    max_tokens_per_doc: int | None,
) -> ScoreRequest:
    cut = body.truncate_prompt_tokens
    return ScoreRequest(
        queries=queries,
        documents=documents,
        query_field=query_field,
        documents_field=documents_field,
        model=body.model,
        truncate=cut is not None and cut != 0,
        side=body.truncation_side or "right",
        max_tokens_per_doc=max_tokens_per_doc or None,
        priority=body.priority,
    )


# --- Answers ------------------------------------------------------------------------------------


class Usage(msgspec.Struct):
    """vLLM's UsageInfo as its pooling routes write it."""

    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0
    prompt_tokens_details: None = None


class PoolingData(msgspec.Struct):
    index: int
    object: str
    # a vector, a vector per token, or base64: msgspec takes no union of two array types
    data: Any


class PoolingAnswer(msgspec.Struct):
    id: str
    object: str
    created: int
    model: str
    data: list[PoolingData]
    usage: Usage


class ScoreData(msgspec.Struct):
    index: int
    object: str
    score: float


class ScoreAnswer(msgspec.Struct):
    id: str
    object: str
    created: int
    model: str
    data: list[ScoreData]
    usage: Usage


class RerankDocument(msgspec.Struct):
    text: str


class RerankResult(msgspec.Struct):
    index: int
    document: RerankDocument | UnsetType
    relevance_score: float


class RerankUsage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int


class RerankAnswer(msgspec.Struct):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


_ENCODER = msgspec.json.Encoder()


def encode_pooling(call: PoolingCall, result: Embeddings | TokenEmbeddings, served: str) -> bytes:
    """`/pooling`: each input's vector (task embed) or per-token vectors (token_embed); base64
    is the float32 values flattened, little-endian."""
    base64 = call.encoding_format == "base64"
    data: list[PoolingData] = []
    if isinstance(result, Embeddings):
        for i, vector in enumerate(result.vectors):
            data.append(PoolingData(i, "pooling", float32_base64(vector) if base64 else vector))
    else:
        for i, tokens in enumerate(result.vectors):
            flat = [x for t in tokens for x in t]
            data.append(PoolingData(i, "pooling", float32_base64(flat) if base64 else tokens))
    model = call.request.model or served
    usage = Usage(result.prompt_tokens, result.prompt_tokens)
    answer = PoolingAnswer(_id("pool"), "list", int(time.time()), model, data, usage)
    return _ENCODER.encode(answer)


def encode_score(request: ScoreRequest, result: Scores, served: str) -> bytes:
    """`/score`: one score per pair, in the request's order."""
    data = [ScoreData(i, "score", float(s)) for i, s in enumerate(result.scores)]
    usage = Usage(result.prompt_tokens, result.prompt_tokens)
    model = request.model or served
    return _ENCODER.encode(ScoreAnswer(_id("score"), "list", int(time.time()), model, data, usage))


def rerank_answer(request: ScoreRequest, result: Scores, served: str) -> RerankAnswer:
    results = [
        RerankResult(
            r.index,
            RerankDocument(request.documents[r.index]) if request.return_documents else UNSET,
            r.score,
        )
        for r in ranked(result.scores, request.top_n)
    ]
    usage = RerankUsage(result.prompt_tokens, result.prompt_tokens)
    return RerankAnswer(_id("rerank"), request.model or served, usage, results)


def encode_rerank(request: ScoreRequest, result: Scores, served: str) -> bytes:
    """`/rerank`: the documents best first, each with its text unless Jina's
    `return_documents` is false."""
    return _ENCODER.encode(rerank_answer(request, result, served))


def _id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"
