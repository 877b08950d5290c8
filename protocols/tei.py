"""Hugging Face Text Embeddings Inference's routes: POST `/embed`, `/embed_all`, `/rerank`,
`/similarity`, `/tokenize`, GET `/info`, and TEI's body on `/` and SageMaker's `/invocations`.

Shapes follow TEI's router (router/src/http/types.rs and server.rs): answers are bare JSON
arrays; errors are `{"error", "error_type"}` with `error_type` one of TEI's `ErrorType` names
as its router writes them (`Validation`, `Empty`, `Backend`, `Overloaded`, `Unhealthy`);
no inputs is 400 `Empty`, every other refusal (too many inputs included) 422 `Validation`.
Unknown fields are ignored, as TEI's (serde's) decoding does. Pure: no I/O.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, assert_never

import msgspec
from msgspec import UNSET, Meta, UnsetType

from protocols.embedding import (
    MAX_DIMENSIONS,
    Body,
    EmbeddingInput,
    EmbeddingRequest,
    Embeddings,
    EmptyInput,
    ScoreRequest,
    Scores,
    TokenEmbeddings,
    check_count,
    check_dimensions,
    cosine,
    decode_inputs,
    decode_struct,
    decode_text,
    decode_texts,
    ranked,
)
from protocols.errors import ErrorKind, GenerationError, invalid, named
from protocols.json_body import decode_json_object

MAX_CLIENT_BATCH_SIZE = 32  # TEI's launcher default: inputs in one request

# TEI takes `Left`/`Right` and the lower-case names huggingface_hub sends.
Direction = Literal["Left", "Right", "left", "right"]


class _Truncation(msgspec.Struct, kw_only=True):
    truncate: bool | None = None  # None: the server's auto_truncate
    truncation_direction: Direction = "Right"
    prompt_name: str | None = None


class EmbedBody(_Truncation, kw_only=True):
    inputs: Any  # a string, token ids, or a list of strings and token-id lists
    normalize: bool = True
    dimensions: Annotated[int, Meta(ge=1, le=MAX_DIMENSIONS)] | None = None


class EmbedAllBody(_Truncation, kw_only=True):
    inputs: Any


class RerankBody(_Truncation, kw_only=True):
    query: Any
    texts: Any
    raw_scores: bool = False
    return_text: bool = False


class SimilarityInput(msgspec.Struct, kw_only=True):
    source_sentence: Any
    sentences: Any


class SimilarityBody(msgspec.Struct, kw_only=True):
    inputs: SimilarityInput
    parameters: _Truncation | None = None


class TokenizeBody(msgspec.Struct, kw_only=True):
    inputs: Any
    add_special_tokens: bool = True
    prompt_name: str | None = None


class TeiTokenize(msgspec.Struct, frozen=True, kw_only=True):
    """Texts to tokenize, each with its field; the answer is a list per text."""

    texts: tuple[str, ...]
    fields: tuple[str, ...]
    add_special_tokens: bool = True
    prompt_name: str | None = None


def decode_embed(
    raw: Body,
    *,
    max_inputs: int = MAX_CLIENT_BATCH_SIZE,
    dimensions_supported: bool,
    auto_truncate: bool = False,
) -> EmbeddingRequest:
    """POST `/embed` (and the body huggingface_hub's `feature_extraction` sends to `/`, its
    parameters at the root). `auto_truncate`: TEI's setting, when `truncate` is not sent."""
    body = decode_struct(raw, EmbedBody)
    check_dimensions(body.dimensions, dimensions_supported, "dimensions")
    return msgspec.structs.replace(
        _embedding(body, body.inputs, max_inputs, auto_truncate),
        normalize=body.normalize,
        dimensions=body.dimensions,
    )


def decode_embed_all(
    raw: Body, *, max_inputs: int = MAX_CLIENT_BATCH_SIZE, auto_truncate: bool = False
) -> EmbeddingRequest:
    """POST `/embed_all`: a vector per token of each input, not normalized (TEI's)."""
    body = decode_struct(raw, EmbedAllBody)
    request = _embedding(body, body.inputs, max_inputs, auto_truncate)
    return msgspec.structs.replace(request, normalize=False, token_level=True)


def decode_rerank(
    raw: Body, *, max_inputs: int = MAX_CLIENT_BATCH_SIZE, auto_truncate: bool = False
) -> ScoreRequest:
    """POST `/rerank`: the query against each of `texts`, every text answered."""
    body = decode_struct(raw, RerankBody)
    query = decode_text(body.query, "query")
    texts = decode_texts(body.texts, "texts", limit=max_inputs)
    return ScoreRequest(
        queries=(query,),
        documents=texts,
        query_field="query",
        documents_field="texts",
        return_documents=body.return_text,
        raw_scores=body.raw_scores,
        truncate=auto_truncate if body.truncate is None else body.truncate,
        side=_side(body.truncation_direction),
    )


def decode_similarity(
    raw: Body, *, max_inputs: int = MAX_CLIENT_BATCH_SIZE, auto_truncate: bool = False
) -> EmbeddingRequest:
    """POST `/similarity` (and huggingface_hub's `sentence_similarity` on `/`): the source
    sentence and then each sentence embedded, not normalized; `similarities` answers."""
    body = decode_struct(raw, SimilarityBody)
    source = decode_text(body.inputs.source_sentence, "inputs.source_sentence")
    sentences = decode_texts(body.inputs.sentences, "inputs.sentences", limit=max_inputs)
    check_count(len(sentences) + 1, max_inputs, "inputs.sentences", "inputs with the source")
    others = (EmbeddingInput(f"inputs.sentences[{i}]", text=s) for i, s in enumerate(sentences))
    inputs = (EmbeddingInput("inputs.source_sentence", text=source), *others)
    p = body.parameters or _Truncation()
    return EmbeddingRequest(
        inputs=inputs,
        truncate=auto_truncate if p.truncate is None else p.truncate,
        side=_side(p.truncation_direction),
        prompt_name=p.prompt_name,
        normalize=False,
    )


def decode_tokenize(raw: Body, *, max_inputs: int = MAX_CLIENT_BATCH_SIZE) -> TeiTokenize:
    body = decode_struct(raw, TokenizeBody)
    if isinstance(body.inputs, str):
        texts: tuple[str, ...] = (decode_text(body.inputs, "inputs"),)
        fields: tuple[str, ...] = ("inputs",)
    else:
        texts = decode_texts(body.inputs, "inputs", limit=max_inputs)
        fields = tuple(f"inputs[{i}]" for i in range(len(texts)))
    return TeiTokenize(
        texts=texts,
        fields=fields,
        add_special_tokens=body.add_special_tokens,
        prompt_name=body.prompt_name,
    )


def _embedding(
    body: _Truncation, inputs: Any, max_inputs: int, auto_truncate: bool
) -> EmbeddingRequest:
    return EmbeddingRequest(
        inputs=decode_inputs(inputs, "inputs", limit=max_inputs, mixed=True),
        truncate=auto_truncate if body.truncate is None else body.truncate,
        side=_side(body.truncation_direction),
        prompt_name=body.prompt_name,
    )


def _side(direction: Direction) -> Literal["left", "right"]:
    return "left" if direction.lower() == "left" else "right"


# --- Answers ------------------------------------------------------------------------------------


class Rank(msgspec.Struct, kw_only=True):
    index: int
    text: str | UnsetType = UNSET  # with `return_text` only
    score: float


class SimpleToken(msgspec.Struct):
    id: int
    text: str
    special: bool
    start: int | None  # character offsets in the text; null for an added special token
    stop: int | None


class EmbeddingModel(msgspec.Struct):
    pooling: str  # "mean", "cls", "last_token", "splade"


class EmbeddingType(msgspec.Struct):
    embedding: EmbeddingModel


class Info(msgspec.Struct, kw_only=True):
    """GET `/info`, TEI's `Info` (router/src/lib.rs); `model_type` is `{"embedding":
    {"pooling": ...}}` (TEI's `{"reranker": ...}` is a cross-encoder's, which this does not
    serve: its scores are a bi-encoder's)."""

    model_id: str
    model_sha: str | None = None
    model_dtype: str  # as TEI writes it: float32, float16, bfloat16
    served_model_name: str
    model_type: EmbeddingType
    max_concurrent_requests: int
    max_input_length: int
    max_batch_tokens: int
    max_batch_requests: int | None = None
    max_client_batch_size: int = MAX_CLIENT_BATCH_SIZE
    auto_truncate: bool = False
    tokenization_workers: int = 1
    version: str
    sha: str | None = None
    docker_label: str | None = None


class ErrorResponse(msgspec.Struct):
    error: str
    error_type: str


_ENCODER = msgspec.json.Encoder()


def encode_embed(result: Embeddings) -> bytes:
    """`/embed`: a list of vectors, one per input (a single input too)."""
    return _ENCODER.encode(result.vectors)


def encode_embed_all(result: TokenEmbeddings) -> bytes:
    """`/embed_all`: for each input, a list of per-token vectors."""
    return _ENCODER.encode(result.vectors)


def encode_rerank(request: ScoreRequest, result: Scores) -> bytes:
    """`/rerank`: every text, best first, with its text when `return_text` asked."""
    ranks = [
        Rank(
            index=r.index,
            text=request.documents[r.index] if request.return_documents else UNSET,
            score=r.score,
        )
        for r in ranked(result.scores, request.top_n)
    ]
    return _ENCODER.encode(ranks)


def similarities(result: Embeddings) -> list[float]:
    """`/similarity`'s values: the cosine of the source sentence's vector (the first) with
    each sentence's, in order."""
    source, *others = result.vectors
    return [cosine(source, v) for v in others]


def encode_similarity(result: Embeddings) -> bytes:
    return _ENCODER.encode(similarities(result))


def encode_tokenize(tokens: list[list[SimpleToken]]) -> bytes:
    """`/tokenize`: for each text, its tokens."""
    return _ENCODER.encode(tokens)


def encode_info(info: Info) -> bytes:
    return _ENCODER.encode(info)


def _status(kind: ErrorKind) -> tuple[int, str]:
    """(status, error_type) as TEI's router answers each kind (server.rs's `From<&ErrorType>`)."""
    match kind:
        case (
            ErrorKind.INVALID_REQUEST
            | ErrorKind.UNPROCESSABLE
            | ErrorKind.CONTEXT_LENGTH_EXCEEDED
            | ErrorKind.DUPLICATE_REQUEST_ID
        ):
            return 422, "Validation"
        case ErrorKind.RATE_LIMITED:
            return 429, "Overloaded"
        case ErrorKind.UNAUTHORIZED:
            return 401, "Unauthorized"  # TEI's own 401 has no body
        case ErrorKind.ENGINE_ERROR:
            return 424, "Backend"
        case ErrorKind.ENGINE_UNAVAILABLE:
            return 503, "Unhealthy"
        case _:
            assert_never(kind)


def error_of(error: GenerationError) -> tuple[int, bytes]:
    """TEI's status and body: 400 `Empty` for nothing to embed, 422 `Validation`, 424
    `Backend`, 429 `Overloaded`, 503 `Unhealthy`."""
    status, error_type = (400, "Empty") if isinstance(error, EmptyInput) else _status(error.kind)
    return status, _ENCODER.encode(ErrorResponse(named(error), error_type))


# --- `/` and `/invocations`: the task read from the body ---------------------------------------

Task = Literal["embed", "rerank", "similarity"]


def task_of(doc: dict[str, Any]) -> Task:
    """Which TEI route a body on `/` or SageMaker's `/invocations` is for. TEI itself serves
    one route there, picked by its model's type (and TASK=sentence-similarity); a gateway
    with several models reads the body: `query` and `texts` rerank, an object in `inputs`
    (`source_sentence`, `sentences`) is a similarity, anything else embeds."""
    if "query" in doc and "texts" in doc:
        return "rerank"
    if isinstance(doc.get("inputs"), dict):
        return "similarity"
    if "inputs" not in doc:
        raise invalid("Send `inputs` to embed, or `query` and `texts` to rerank", "inputs")
    return "embed"


# What a generation's body on `/` (TGI's) or `/invocations` (LMI's) holds and TEI's never do:
# huggingface_hub's text_generation always sends `parameters` and `stream`.
_GENERATION_FIELDS = ("parameters", "stream", "messages")


def is_tei_body(doc: dict[str, Any]) -> bool:
    """Whether a body on `/` or `/invocations`, paths a generation shares, is TEI's: `query`
    with `texts` (rerank), an object in `inputs` (similarity), or none of a generation's
    fields (embed: what huggingface_hub's feature_extraction sends; a body without `inputs`
    is then refused as TEI refuses it, naming `inputs`)."""
    if "query" in doc and "texts" in doc:
        return True
    if isinstance(doc.get("inputs"), dict):
        return True
    return not any(f in doc for f in _GENERATION_FIELDS)


def is_tei_tokenize(doc: dict[str, Any]) -> bool:
    """POST `/tokenize` is TEI's and vLLM's: TEI's body has `inputs`, vLLM's `prompt` or
    `messages`."""
    return "inputs" in doc and "prompt" not in doc and "messages" not in doc


def is_tei_rerank(doc: dict[str, Any]) -> bool:
    """POST `/rerank` is TEI's and vLLM's: TEI's body has `texts`, vLLM's (Jina's) `documents`."""
    return "texts" in doc and "documents" not in doc


def decode_invocation(
    raw: Body,
    *,
    max_inputs: int = MAX_CLIENT_BATCH_SIZE,
    dimensions_supported: bool,
    auto_truncate: bool = False,
) -> tuple[Task, EmbeddingRequest | ScoreRequest]:
    """A body on `/` or `/invocations`: its task and its request, as that TEI route decodes
    it (the answer is that route's: encode_embed, encode_rerank or encode_similarity)."""
    doc = raw if isinstance(raw, dict) else decode_json_object(raw)
    task = task_of(doc)
    match task:
        case "rerank":
            return task, decode_rerank(doc, max_inputs=max_inputs, auto_truncate=auto_truncate)
        case "similarity":
            request = decode_similarity(doc, max_inputs=max_inputs, auto_truncate=auto_truncate)
            return task, request
        case "embed":
            request = decode_embed(
                doc,
                max_inputs=max_inputs,
                dimensions_supported=dimensions_supported,
                auto_truncate=auto_truncate,
            )
            return task, request
        case _:
            assert_never(task)
