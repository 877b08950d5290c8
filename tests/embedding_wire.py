"""A loopback HTTP server on the embedding wire contracts alone, for the real clients to talk to
without an engine: each route decodes with its family's decoder, asks a deterministic fake
model, and answers with its family's encoder (or its error shape). What the clients send is
what the codecs decode; what they parse is what the codecs encode.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from protocols import cohere, openai_embeddings, tei, vllm_pooling
from protocols.embedding import (
    EmbeddingInput,
    EmbeddingRequest,
    Embeddings,
    ScoreRequest,
    Scores,
    TokenEmbeddings,
    cosine,
)
from protocols.errors import ErrorKind, GenerationError
from protocols.json_body import decode_json_object
from protocols.openai_answers import error_of as openai_error

SERVED = "fake-minilm"
DIM = 16
MAX_INPUT_TOKENS = 64


def raw_vector(text: str) -> list[float]:
    """The fake model's vector for a text: values in [-1, 1] from its hash, not normalized."""
    digest = hashlib.sha256(text.encode()).digest()
    return [(digest[i] - 127.5) / 127.5 for i in range(DIM)]


def text_of(item: EmbeddingInput) -> str:
    if item.text is not None:
        return item.text
    return " ".join(str(t) for t in item.token_ids or ())


def tokens_of(item: EmbeddingInput | str) -> int:
    if isinstance(item, str):
        return len(item.split()) + 2
    if item.token_ids is not None:
        return len(item.token_ids)
    return len(text_of(item).split()) + 2  # [CLS] ... [SEP]


def vector(item: EmbeddingInput, request: EmbeddingRequest) -> list[float]:
    v = raw_vector(text_of(item))[: request.dimensions or DIM]
    if request.normalize is False:
        return v
    norm = math.sqrt(sum(x * x for x in v))
    return [x / norm for x in v]


def embed(request: EmbeddingRequest) -> Embeddings:
    for item in request.inputs:
        if tokens_of(item) > MAX_INPUT_TOKENS and not request.truncates:
            message = f"Input of {tokens_of(item)} tokens is longer than {MAX_INPUT_TOKENS}"
            raise GenerationError(ErrorKind.CONTEXT_LENGTH_EXCEEDED, message, item.field)
    tokens = sum(min(tokens_of(i), MAX_INPUT_TOKENS) for i in request.inputs)
    return Embeddings([vector(i, request) for i in request.inputs], tokens)


def embed_tokens(request: EmbeddingRequest) -> TokenEmbeddings:
    per_input = [
        [raw_vector(f"{text_of(i)}#{t}") for t in range(tokens_of(i))] for i in request.inputs
    ]
    return TokenEmbeddings(per_input, sum(tokens_of(i) for i in request.inputs))


def score(request: ScoreRequest) -> Scores:
    pairs = request.pairs()
    scores = [cosine(raw_vector(q), raw_vector(d)) for q, d in pairs]
    return Scores(scores, sum(tokens_of(q) + tokens_of(d) for q, d in pairs))


Route = Callable[[bytes], bytes]


def _openai(raw: bytes) -> bytes:
    call = openai_embeddings.decode_embeddings(raw, dimensions_supported=False)
    return openai_embeddings.encode_embeddings(call, embed(call.request), SERVED)


def _tei_embed(raw: bytes) -> bytes:
    return tei.encode_embed(embed(tei.decode_embed(raw, dimensions_supported=False)))


def _tei_embed_all(raw: bytes) -> bytes:
    return tei.encode_embed_all(embed_tokens(tei.decode_embed_all(raw)))


def _tei_similarity(raw: bytes) -> bytes:
    return tei.encode_similarity(embed(tei.decode_similarity(raw)))


def _tei_invocation(raw: bytes) -> bytes:
    task, request = tei.decode_invocation(raw, dimensions_supported=False)
    if isinstance(request, ScoreRequest):
        return tei.encode_rerank(request, score(request))
    if task == "similarity":
        return tei.encode_similarity(embed(request))
    return tei.encode_embed(embed(request))


def _tei_tokenize(raw: bytes) -> bytes:
    asked = tei.decode_tokenize(raw)
    tokens = []
    for text in asked.texts:
        words, at = [], 0
        for i, word in enumerate(text.split(" ")):
            words.append(tei.SimpleToken(100 + i, word, False, at, at + len(word)))
            at += len(word) + 1
        tokens.append(words)
    return tei.encode_tokenize(tokens)


def _rerank(raw: bytes) -> bytes:
    """POST `/rerank`: TEI's body (`texts`) or vLLM's (`documents`)."""
    doc = decode_json_object(raw)
    if tei.is_tei_rerank(doc):
        request = tei.decode_rerank(doc)
        return tei.encode_rerank(request, score(request))
    request = vllm_pooling.decode_rerank(doc)
    return vllm_pooling.encode_rerank(request, score(request), SERVED)


def _pooling(raw: bytes) -> bytes:
    call = vllm_pooling.decode_pooling(raw, dimensions_supported=False)
    result = embed_tokens(call.request) if call.request.token_level else embed(call.request)
    return vllm_pooling.encode_pooling(call, result, SERVED)


def _score(raw: bytes) -> bytes:
    request = vllm_pooling.decode_score(raw)
    return vllm_pooling.encode_score(request, score(request), SERVED)


def _cohere_embed(raw: bytes) -> bytes:
    call = cohere.decode_embed(raw, dimensions_supported=False)
    return cohere.encode_embed(call, embed(call.request))


def _cohere_rerank(raw: bytes) -> bytes:
    request = cohere.decode_rerank(raw)
    return cohere.encode_rerank(request, score(request), SERVED)


ErrorOf = Callable[[GenerationError], tuple[int, bytes]]

ROUTES: dict[str, tuple[Route, ErrorOf]] = {
    "/v1/embeddings": (_openai, openai_error),
    "/": (_tei_invocation, tei.error_of),
    "/invocations": (_tei_invocation, tei.error_of),
    "/embed": (_tei_embed, tei.error_of),
    "/embed_all": (_tei_embed_all, tei.error_of),
    "/similarity": (_tei_similarity, tei.error_of),
    "/tokenize": (_tei_tokenize, tei.error_of),
    "/pooling": (_pooling, openai_error),
    "/score": (_score, openai_error),
    "/v1/score": (_score, openai_error),
    "/v1/rerank": (_rerank, openai_error),
    "/v2/embed": (_cohere_embed, cohere.error_of),
    "/v2/rerank": (_cohere_rerank, cohere.error_of),
}


def answer(path: str, raw: bytes) -> tuple[int, bytes]:
    route: Route
    error_of: ErrorOf
    if path == "/rerank":
        try:
            tei_body = tei.is_tei_rerank(decode_json_object(raw))
        except GenerationError as e:
            return openai_error(e)
        route, error_of = _rerank, (tei.error_of if tei_body else openai_error)
    else:
        route, error_of = ROUTES[path]
    try:
        return 200, route(raw)
    except GenerationError as e:
        return error_of(e)


INFO = tei.Info(
    model_id="sentence-transformers/all-MiniLM-L6-v2",
    model_dtype="float32",
    served_model_name=SERVED,
    model_type=tei.EmbeddingType(tei.EmbeddingModel("mean")),
    max_concurrent_requests=512,
    max_input_length=MAX_INPUT_TOKENS,
    max_batch_tokens=16384,
    version="0.1.0",
)


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        if path not in ROUTES and path != "/rerank":
            self._send(404, b'{"error": "no route"}')
            return
        self._send(*answer(path, raw))

    def do_GET(self) -> None:
        if self.path == "/info":
            self._send(200, tei.encode_info(INFO))
        else:
            self._send(404, b'{"error": "no route"}')

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def wire_server() -> Iterator[str]:
    """The server's base URL, for as long as the block runs."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
