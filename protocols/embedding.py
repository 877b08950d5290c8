"""The neutral vocabulary of embeddings and scores: what every embedding family's wire contract
decodes a request into and encodes its answer from (protocols/openai_embeddings.py, tei.py,
cohere.py, vllm_pooling.py). Pure: no I/O; the engine that pools is another layer's.
"""

from __future__ import annotations

import array
import base64
import math
import sys
from collections.abc import Sequence
from typing import Any, Literal, TypeVar

import msgspec

from protocols.errors import ErrorKind, GenerationError, invalid, validation_error
from protocols.generation import MAX_TOKEN_ID
from protocols.json_body import MALFORMED, malformed

T = TypeVar("T")

# Every family's numbers bounded: past any model's vector, context, or documents in a request.
MAX_DIMENSIONS = 65_536
MAX_TOKENS = 1 << 20
MAX_TOP_N = 1 << 20

# Which end of a too-long input is cut: "right" keeps its first tokens, "left" its last.
Side = Literal["left", "right"]


class EmptyInput(GenerationError):
    """A request with nothing to embed or score (no inputs, an empty text): an invalid request
    that TEI answers with its own status (400 `Empty`, where other refusals are 422)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(ErrorKind.INVALID_REQUEST, message, field)


class EmbeddingInput(msgspec.Struct, frozen=True):
    """One input: a text, or token ids already tokenized; `field` is where the request gave it
    (`input[3]`), for the errors about it (too long, a token id out of vocabulary)."""

    field: str
    text: str | None = None
    token_ids: tuple[int, ...] | None = None


class EmbeddingRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What every embedding route asks of a pooling model.

    `truncate`: an input longer than the model takes is cut at `side` (else refused, naming
    its field); `max_tokens`: each input cut to at most that many tokens first (Cohere's
    `max_tokens`, vLLM's `truncate_prompt_tokens`). `normalize` None: the model's own pooling
    configuration decides. `dimensions`: keep the first n of each vector (Matryoshka), already
    checked against what the caller said the model supports. `token_level`: one vector per
    token rather than one per input (TEI's `/embed_all`)."""

    inputs: tuple[EmbeddingInput, ...]
    model: str | None = None
    truncate: bool = False
    side: Side = "right"
    max_tokens: int | None = None
    normalize: bool | None = None
    dimensions: int | None = None
    dimensions_field: str = "dimensions"
    prompt_name: str | None = None  # a sentence-transformers prompt put before each text
    token_level: bool = False
    priority: int | None = None

    @property
    def truncates(self) -> bool:
        return self.truncate or self.max_tokens is not None


class Embeddings(msgspec.Struct, frozen=True):
    """An embedding request's result: one vector per input, in the inputs' order, and the
    prompt tokens embedded (every input's, special tokens included)."""

    vectors: list[list[float]]
    prompt_tokens: int


class TokenEmbeddings(msgspec.Struct, frozen=True):
    """A token-level request's result: for each input, one vector per token."""

    vectors: list[list[list[float]]]
    prompt_tokens: int


class ScoreRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Scores of text pairs: a query against each document (rerank: `queries` holds one) or
    each query against its document (vLLM's `/score` N:N). `top_n` None: every document
    answered; `raw_scores`: the model's logit, no sigmoid (TEI's); the fields name where the
    request gave the queries and the documents (`query`, `text_1`, `documents`)."""

    queries: tuple[str, ...]
    documents: tuple[str, ...]
    query_field: str
    documents_field: str
    model: str | None = None
    top_n: int | None = None
    return_documents: bool = False
    raw_scores: bool = False
    truncate: bool = True
    side: Side = "right"
    max_tokens_per_doc: int | None = None
    priority: int | None = None

    def pairs(self) -> list[tuple[str, str]]:
        """(query, document) for each document, in the documents' order."""
        if len(self.queries) == 1:
            return [(self.queries[0], d) for d in self.documents]
        return list(zip(self.queries, self.documents, strict=True))


class Scores(msgspec.Struct, frozen=True):
    """A score request's result: one score per pair, in the documents' order."""

    scores: list[float]
    prompt_tokens: int


class Ranked(msgspec.Struct, frozen=True):
    index: int  # the document's place in the request
    score: float


def ranked(scores: Sequence[float], top_n: int | None) -> list[Ranked]:
    """Best first (ties in the request's order), the first `top_n` when set."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    if top_n is not None:
        order = order[:top_n]
    return [Ranked(i, float(scores[i])) for i in order]


def float32_base64(vector: Sequence[float]) -> str:
    """A vector as OpenAI sends one with `encoding_format: base64`: its float32 values,
    little-endian, in base64 (what the openai SDK reads with `numpy.frombuffer(.., "float32")`)."""
    values = array.array("f", vector)
    if sys.byteorder == "big":
        values.byteswap()
    return base64.b64encode(values.tobytes()).decode("ascii")


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity; 0 against a zero vector."""
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norms = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norms if norms else 0.0


# A request's body: its bytes, or the JSON object already read from them (a route that picks
# its decoder by the body's fields).
Body = bytes | str | dict[str, Any]


def decode_struct(raw: Body, kind: type[T]) -> T:
    """The body as `kind`; a wrong field fails naming it (`$.encoding_format`), a body that is
    not JSON at `$`."""
    try:
        if isinstance(raw, dict):
            return msgspec.convert(raw, kind)
        return msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as e:
        raise validation_error(e) from e
    except MALFORMED as e:
        raise malformed(e, raw) from e


def check_dimensions(dimensions: int | None, supported: bool, field: str) -> None:
    """`dimensions` only where the model serves shortened vectors (Matryoshka), as the caller
    says; the model's own width is the engine's to check."""
    if dimensions is not None and not supported:
        raise invalid(f"This model does not support specifying `{field}`", field)


def check_count(count: int, limit: int, field: str, what: str = "inputs") -> None:
    if count > limit:
        raise invalid(f"`{field}` has {count} {what}; at most {limit} per request", field)


def decode_inputs(
    value: Any, field: str, *, limit: int, mixed: bool = False
) -> tuple[EmbeddingInput, ...]:
    """A string, a list of strings, a list of token ids, or a list of lists of token ids (and,
    when `mixed`, strings and token-id lists in one list, as TEI takes them) as inputs, each
    named by its field (`input`, `input[3]`); at most `limit` of them."""
    if isinstance(value, str):
        return (_text(value, field),)
    if not isinstance(value, list):
        raise invalid(f"`{field}` must be {_FORMS}", field)
    if not value:
        raise EmptyInput(f"`{field}` cannot be empty", field)
    if all(_is_token_id(v) for v in value):
        return (EmbeddingInput(field, token_ids=_token_ids(value, field)),)
    check_count(len(value), limit, field)
    inputs = []
    kind: type | None = None
    for i, item in enumerate(value):
        where = f"{field}[{i}]"
        if isinstance(item, str):
            inputs.append(_text(item, where))
        elif isinstance(item, list):
            if not item:
                raise EmptyInput(f"`{where}` cannot be empty", where)
            inputs.append(EmbeddingInput(where, token_ids=_token_ids(item, where)))
        else:
            raise invalid(f"`{where}` must be a string or a list of token ids", where)
        if not mixed and kind is not None and type(item) is not kind:
            raise invalid(f"`{field}` must be {_FORMS}, not a mix", where)
        kind = type(item)
    return tuple(inputs)


def decode_texts(value: Any, field: str, *, limit: int) -> tuple[str, ...]:
    """A non-empty list of non-empty strings, at most `limit` of them."""
    if not isinstance(value, list):
        raise invalid(f"`{field}` must be a list of strings", field)
    if not value:
        raise EmptyInput(f"`{field}` cannot be empty", field)
    check_count(len(value), limit, field)
    return tuple(_text(item, f"{field}[{i}]").text or "" for i, item in enumerate(value))


def decode_text(value: Any, field: str) -> str:
    return _text(value, field).text or ""


_FORMS = "a string, a list of strings, a list of token ids or a list of lists of token ids"


def _text(value: Any, field: str) -> EmbeddingInput:
    if not isinstance(value, str):
        raise invalid(f"`{field}` must be a string", field)
    if not value:
        raise EmptyInput(f"`{field}` cannot be an empty string", field)
    return EmbeddingInput(field, text=value)


def _is_token_id(value: Any) -> bool:
    return type(value) is int


def _token_ids(values: list[Any], field: str) -> tuple[int, ...]:
    for i, v in enumerate(values):
        if not _is_token_id(v) or not 0 <= v <= MAX_TOKEN_ID:
            raise invalid(
                f"`{field}[{i}]` must be a token id, 0 to {MAX_TOKEN_ID}", f"{field}[{i}]"
            )
    return tuple(values)
