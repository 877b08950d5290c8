"""vLLM's POST `/tokenize` and `/detokenize`, with the served model's own tokenizer and chat
template. The shapes are protocols/tokenize.py; errors are OpenAI's error object."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.http.chat import error_answer, openai_refusal
from gateway.http.embedding_answers import tei_tokenize, tei_tokenize_body_of
from gateway.http.model_choice import ModelRefused, asked_model, body_model, chat_model_for
from gateway.http.openapi import Op
from gateway.http.prepared import JSON, Prepared, Whole, to_response
from gateway.state import gateway_of
from protocols.errors import GenerationError
from protocols.openai_answers import ErrorBody, not_found
from protocols.openai_requests import check_token_ids, unknown_model
from protocols.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
    decode_detokenize,
    decode_tokenize,
    encode,
)


async def tokenize(request: Request) -> Response:
    return to_response(await _tokenized(request))


async def _tokenized(request: Request) -> Prepared:
    """vLLM's body; with an embedding model served, TEI's (`inputs`) tokenized as TEI does."""
    gateway = gateway_of(request)
    raw = await request.body()
    tei_body = tei_tokenize_body_of(gateway, raw)
    if tei_body is not None:
        return await tei_tokenize(gateway, tei_body)
    chosen = chat_model_for(gateway, asked_model(request, body_model(raw)))
    if isinstance(chosen, ModelRefused):
        return openai_refusal(chosen)
    model = chosen.served
    try:
        body = decode_tokenize(raw)
        why = unknown_model(body.model, model.name)
        if why is not None:
            return Whole(404, not_found(why), JSON)
        text = body.prompt
        if body.messages is not None:
            text = await model.render_chat(
                body.conversation(),
                add_generation_prompt=body.add_generation_prompt,
                continue_final_message=body.continue_final_message,
                tools=body.tool_definitions(),
            )
        ids = await model.tokenize(text or "", special_tokens=body.special_tokens)
        strings = await model.token_strings(ids) if body.return_token_strs else None
    except GenerationError as e:
        return error_answer(e)
    answer = TokenizeResponse(len(ids), model.context_length(), ids, strings)
    return Whole(200, encode(answer), JSON)


async def detokenize(request: Request) -> Response:
    return to_response(await _detokenized(request))


async def _detokenized(request: Request) -> Prepared:
    model = gateway_of(request).model
    try:
        body = decode_detokenize(await request.body())
        why = unknown_model(body.model, model.name)
        if why is not None:
            return Whole(404, not_found(why), JSON)
        check_token_ids(body.tokens, await model.vocabulary(), "tokens")
        text = await model.decode(body.tokens)
    except GenerationError as e:
        return error_answer(e)
    return Whole(200, encode(DetokenizeResponse(text)), JSON)


routes = [
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
]
ERRORS = (400, 401, 404, 413, 503)
operations = [
    Op(
        "post",
        "/tokenize",
        "vLLM's tokenize: a prompt, or messages in the chat template",
        TokenizeRequest,
        {JSON: TokenizeResponse},
        ErrorBody,
        ERRORS,
    ),
    Op(
        "post",
        "/detokenize",
        "vLLM's detokenize",
        DetokenizeRequest,
        {JSON: DetokenizeResponse},
        ErrorBody,
        ERRORS,
    ),
]
