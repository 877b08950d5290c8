"""Ollama's API (docs/OLLAMA.md): POST `/api/chat` and `/api/generate` (NDJSON streams, or
whole), `/api/embed` and `/api/embeddings` on the embedding model, GET `/api/tags`, `/api/ps`,
`/api/version`, POST `/api/show`, GET and HEAD `/`; `/api/pull`, `push`, `create`, `copy` and
`delete` refused saying why. A chat or a generate becomes the chat call the OpenAI route makes
(protocols/ollama_requests.py), so tools, adapters (`model`), keys (`Authorization: Bearer`),
limits and priorities are every route's; answers and errors are Ollama's
(protocols/ollama_answers.py, protocols/ollama_models.py). `keep_alive` and a request with no
prompt are the residency's (gateway/engine_path/residency.py).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from datetime import UTC, datetime

from msgspec.structs import replace
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from gateway.engine_path.chat_model import ChatModel
from gateway.engine_path.embedding_model import EmbeddingModel
from gateway.http.chat import ModelNotServed, resolve
from gateway.http.encoded_chat import encoded_answer
from gateway.http.model_choice import (
    ModelRefused,
    asked_model,
    body_model,
    chat_model_for,
    embedding_model_for,
)
from gateway.http.openapi import TEXT, Op
from gateway.http.prepared import JSON, Prepared, Whole, to_response
from gateway.http.streaming import Step
from gateway.observability.tracing import refused
from gateway.state import Gateway, gateway_of
from protocols import ollama_answers, ollama_models, ollama_requests
from protocols.embedding import EmbeddingRequest
from protocols.errors import GenerationError
from protocols.events import Delta, History, token_array
from protocols.names import Protocol
from protocols.ollama_answers import NDJSON, Kind, OllamaEncoder, error_of, not_found
from protocols.ollama_models import OllamaDetails, OllamaListed, OllamaRunning, details, digest_of
from protocols.ollama_requests import OllamaCall, OllamaGenerate, model_name

_FAR_AHEAD = "2318-01-01T00:00:00Z"  # a model that stays loaded (Ollama's own "forever")
_STARTED = datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _error(error: GenerationError) -> Whole:
    refused(error)
    status, body = error_of(error)
    return Whole(status, body, JSON)


def _refused(refused: ModelRefused, asked: str | None) -> Whole:
    if refused.status == 404:
        return Whole(404, not_found(asked or ""), JSON)
    return _error(refused.error)


def _chosen(request: Request, raw: bytes) -> tuple[ChatModel | ModelRefused, str | None]:
    named = body_model(raw)
    asked = asked_model(request, model_name(named) if named is not None else None)
    return chat_model_for(gateway_of(request), asked), asked


async def chat(request: Request) -> Response:
    return to_response(await _chat(request))


async def _chat(request: Request) -> Prepared:
    encoder = OllamaEncoder("chat", "")  # as the request arrives: its durations' start
    raw = await request.body()
    chosen, asked = _chosen(request, raw)
    if isinstance(chosen, ModelRefused):
        return _refused(chosen, asked)
    try:
        decoded = ollama_requests.decode_chat(raw, chosen.served.context_length())
    except GenerationError as e:
        return _error(e)
    return await _generation(request, chosen, decoded, encoder)


async def generate(request: Request) -> Response:
    return to_response(await _generate(request))


async def _generate(request: Request) -> Prepared:
    encoder = OllamaEncoder("generate", "")
    raw = await request.body()
    chosen, asked = _chosen(request, raw)
    if isinstance(chosen, ModelRefused):
        return _refused(chosen, asked)
    try:
        decoded = ollama_requests.decode_generate(raw, chosen.served.context_length())
        ollama = decoded.ollama
        if decoded.context is not None and not ollama.load_only:
            ollama = await _continued(chosen, decoded)
    except GenerationError as e:
        return _error(e)
    return await _generation(request, chosen, ollama, encoder)


async def _continued(model: ChatModel, decoded: OllamaGenerate) -> OllamaCall:
    """The prompt as `context`'s token ids, then the new text's: the prefix cache holds the
    context's KV blocks from the answer that handed it back."""
    assert decoded.context is not None
    served = model.served
    text = decoded.text
    if not decoded.raw:
        turns = ollama_requests.turns(decoded.system, text)
        text = await served.render_chat(turns)
    ids = [*decoded.context, *await served.tokenize(text, special_tokens=False)]
    call = decoded.ollama.call
    [first] = call.requests
    history = History(token_array(ids), "")
    continued = replace(first, history=history, messages=None, prompt="", prompt_field="context")
    return replace(decoded.ollama, call=replace(call, requests=[continued], token_prompts=True))


async def _generation(
    request: Request, chosen: ChatModel, ollama: OllamaCall, encoder: OllamaEncoder
) -> Prepared:
    residency = gateway_of(request).chats.residency
    if ollama.load_only:
        return await _residency(gateway_of(request), chosen, ollama, encoder.kind)
    if ollama.keep_alive is not None:
        residency.keep_alive(chosen, ollama.keep_alive)
    try:
        call, tools, served = await resolve(chosen.served, ollama.call)
    except GenerationError as e:
        return _error(e)
    except ModelNotServed:
        return Whole(404, not_found(ollama.model), JSON)
    encoder.model, encoder.tools = served, tools
    steps = _timed(chosen.batches.run(call.requests, Protocol.OLLAMA), encoder)
    return await encoded_answer(
        request, steps, encoder, stream=call.stream, error=_error, media_type=NDJSON, headers=None
    )


async def _timed(
    steps: AsyncGenerator[Step, None], encoder: OllamaEncoder
) -> AsyncGenerator[Step, None]:
    """The steps, each Delta shown to the encoder as it arrives (its first token's time)."""
    async with aclosing(steps):
        async for step in steps:
            for event in step:
                if isinstance(event, Delta):
                    encoder.saw(event)
            yield step


async def _residency(gateway: Gateway, model: ChatModel, ollama: OllamaCall, kind: Kind) -> Whole:
    """A request with no prompt: the model loaded, or with keep_alive 0 unloaded (a pinned or
    busy model stays)."""
    residency = gateway.chats.residency
    media = NDJSON if ollama.call.stream else JSON
    end = b"\n" if ollama.call.stream else b""
    if ollama.keep_alive == 0:
        await residency.unload_now(model)
        return Whole(200, ollama_answers.residency_answer(kind, model.name, "unload") + end, media)
    try:
        await residency.load_now(model)
    except GenerationError as e:
        return _error(e)
    if ollama.keep_alive is not None:
        residency.keep_alive(model, ollama.keep_alive)
    return Whole(200, ollama_answers.residency_answer(kind, model.name, "load") + end, media)


# --- embeddings --------------------------------------------------------------------------------


async def embed(request: Request) -> Response:
    return to_response(await _embedded(request, old=False))


async def embeddings(request: Request) -> Response:
    return to_response(await _embedded(request, old=True))


async def _embedded(request: Request, *, old: bool) -> Whole:
    started = time.perf_counter()
    raw = await request.body()
    named = body_model(raw)
    asked = model_name(named) if named is not None else None
    model = embedding_model_for(gateway_of(request), asked)
    try:
        if isinstance(model, ModelRefused):
            _decode_embed(raw, old, True)  # a bad field is named first
            return _refused(model, asked)
        call = _decode_embed(raw, old, await model.dimensions_supported())
        result = await model.embed(call)
    except GenerationError as e:
        return _error(e)
    if old:
        return Whole(200, ollama_models.encode_old_embedding(result), JSON)
    seconds = time.perf_counter() - started
    return Whole(200, ollama_models.encode_embedded(model.name, result, seconds), JSON)


def _decode_embed(raw: bytes, old: bool, dimensions: bool) -> EmbeddingRequest:
    if old:
        return ollama_models.decode_embeddings(raw)
    return ollama_models.decode_embed(raw, dimensions_supported=dimensions)


# --- models ------------------------------------------------------------------------------------


def _chat_details(model: ChatModel) -> OllamaDetails:
    return details(dtype=model.served.dtype() if model.served.ready else None)


async def tags(request: Request) -> Response:
    gateway = gateway_of(request)
    listed = [
        OllamaListed(m.name, m.name, _STARTED, m.memory_bytes, digest_of(m.name), _chat_details(m))
        for m in gateway.chats
    ]
    listed += [
        OllamaListed(e.name, e.name, _STARTED, 0, digest_of(e.name), details(family="bert"))
        for e in gateway.models.embedding_models()
    ]
    return _json(ollama_models.encode(ollama_models.OllamaTags(listed)))


async def ps(request: Request) -> Response:
    gateway = gateway_of(request)
    residency = gateway.chats.residency
    running = []
    for m in gateway.chats:
        if not m.served.ready:
            continue
        expires = residency.expires_at(m)
        at = _FAR_AHEAD if expires is None else _rfc3339(expires)
        running.append(
            OllamaRunning(
                m.name,
                m.name,
                m.memory_bytes,
                digest_of(m.name),
                _chat_details(m),
                at,
                0,
                m.served.context_length(),
            )
        )
    for e in gateway.models.embedding_models():
        if e.ready:
            facts = OllamaRunning(
                e.name,
                e.name,
                0,
                digest_of(e.name),
                details(),
                _FAR_AHEAD,
                0,
                e.context_length() or 0,
            )
            running.append(facts)
    return _json(ollama_models.encode(ollama_models.OllamaPs(running)))


async def show(request: Request) -> Response:
    gateway = gateway_of(request)
    try:
        asked = ollama_models.shown_model(await request.body())
    except GenerationError as e:
        return to_response(_error(e))
    embedder = gateway.models.embedding(asked) if gateway.models.task_of(asked) == "embed" else None
    if embedder is not None:
        return _json(ollama_models.encode(_shown_embedding(embedder)))
    chosen = chat_model_for(gateway, asked)
    if isinstance(chosen, ModelRefused):
        return to_response(_refused(chosen, asked))
    return _json(ollama_models.encode(await _shown_chat(chosen)))


async def _shown_chat(model: ChatModel) -> ollama_models.OllamaShown:
    served = model.served
    context = served.context_length()
    capabilities = ["completion", "tools"]
    return ollama_models.OllamaShown(
        modelfile=f"# served by llm-gateway\nFROM {model.spec.source}\n",
        parameters=f"num_ctx {context}",
        template=served.chat_template or "",
        details=_chat_details(model),
        model_info={"general.architecture": "", "general.context_length": context},
        capabilities=capabilities,
        modified_at=_STARTED,
    )


def _shown_embedding(model: EmbeddingModel) -> ollama_models.OllamaShown:
    context = model.context_length() or 0
    return ollama_models.OllamaShown(
        modelfile="# served by llm-gateway\n",
        parameters=f"num_ctx {context}",
        template="",
        details=details(family="bert"),
        model_info={"general.architecture": "bert", "general.context_length": context},
        capabilities=["embedding"],
        modified_at=_STARTED,
    )


async def version(request: Request) -> Response:
    return _json(ollama_models.encode(ollama_models.OllamaVersion(ollama_models.VERSION)))


async def running(request: Request) -> Response:
    return PlainTextResponse("Ollama is running")


def _unserved(action: str) -> Route:
    async def refuse(request: Request) -> Response:
        return Response(
            ollama_answers.encode_error(ollama_models.unserved(action)), 403, media_type=JSON
        )

    methods = ["DELETE"] if action == "delete" else ["POST"]
    return Route(f"/api/{action}", refuse, methods=methods)


def _json(body: bytes) -> Response:
    return Response(body, 200, media_type=JSON)


def _rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


routes = [
    Route("/api/chat", chat, methods=["POST"]),
    Route("/api/generate", generate, methods=["POST"]),
    Route("/api/embed", embed, methods=["POST"]),
    Route("/api/embeddings", embeddings, methods=["POST"]),
    Route("/api/tags", tags, methods=["GET"]),
    Route("/api/ps", ps, methods=["GET"]),
    Route("/api/show", show, methods=["POST"]),
    Route("/api/version", version, methods=["GET"]),
    Route("/", running, methods=["GET", "HEAD"]),
    *(_unserved(action) for action in ollama_models.UNSERVED),
]
_ERRORS = (400, 401, 404, 413, 429, 500, 503)
_ANSWER = ollama_answers.OllamaChunk
operations = [
    Op(
        "post",
        "/api/chat",
        "Ollama's chat: its NDJSON chunks (`stream`, the default), or the whole answer",
        ollama_requests.OllamaChatRequest,
        {NDJSON: _ANSWER, JSON: _ANSWER},
        ollama_answers.OllamaError,
        _ERRORS,
    ),
    Op(
        "post",
        "/api/generate",
        "Ollama's generate: a prompt (or `context` continued), streamed or whole",
        ollama_requests.OllamaGenerateRequest,
        {NDJSON: _ANSWER, JSON: _ANSWER},
        ollama_answers.OllamaError,
        _ERRORS,
    ),
    Op(
        "post",
        "/api/embed",
        "Ollama's embeddings, from the embedding model",
        ollama_models.OllamaEmbedRequest,
        {JSON: ollama_models.OllamaEmbedded},
        ollama_answers.OllamaError,
        _ERRORS,
    ),
    Op(
        "post",
        "/api/embeddings",
        "Ollama's older embedding route: one prompt's vector",
        ollama_models.OllamaEmbeddingsRequest,
        {JSON: ollama_models.OllamaEmbedding},
        ollama_answers.OllamaError,
        _ERRORS,
    ),
    Op(
        "get",
        "/api/tags",
        "Every model served",
        None,
        {JSON: ollama_models.OllamaTags},
        ollama_answers.OllamaError,
        (401,),
    ),
    Op(
        "get",
        "/api/ps",
        "The models loaded",
        None,
        {JSON: ollama_models.OllamaPs},
        ollama_answers.OllamaError,
        (401,),
    ),
    Op(
        "post",
        "/api/show",
        "A model's parameters, template and capabilities",
        ollama_models.OllamaShowRequest,
        {JSON: ollama_models.OllamaShown},
        ollama_answers.OllamaError,
        (400, 401, 404),
    ),
    Op(
        "get",
        "/api/version",
        "The Ollama API release answered",
        None,
        {JSON: ollama_models.OllamaVersion},
        ollama_answers.OllamaError,
        (401,),
    ),
    Op("get", "/", "Ollama's liveness answer", None, {"text/plain": TEXT}, None, ()),
    *(
        Op(
            "delete" if action == "delete" else "post",
            f"/api/{action}",
            f"Refused: {reason}",
            None,
            {},
            ollama_answers.OllamaError,
            (403,),
        )
        for action, reason in ollama_models.UNSERVED.items()
    ),
]
