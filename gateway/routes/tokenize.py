"""vLLM's POST `/tokenize` and `/detokenize`, with the engine's own tokenizer and chat
template. The shapes are protocols/tokenize.py; errors are OpenAI's error object."""

from __future__ import annotations

from functools import partial

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.config.settings import served_model_name
from gateway.engine_path.generation import tokenized
from gateway.routes.prepared import JSON
from gateway.state import gateway_of
from protocols.errors import GenerationError
from protocols.openai_answers import error_of, not_found
from protocols.openai_requests import check_token_ids, unknown_model
from protocols.tokenize import (
    DetokenizeResponse,
    TokenizeResponse,
    decode_detokenize,
    decode_tokenize,
    encode,
)


async def tokenize(request: Request) -> Response:
    gateway = gateway_of(request)
    try:
        body = decode_tokenize(await request.body())
        why = unknown_model(body.model, served_model_name(gateway.settings.engine))
        if why is not None:
            return Response(not_found(why), 404, media_type=JSON)
        engine = await gateway.holder.wait()
        text = body.prompt
        if body.messages is not None:
            text = engine.render_chat(
                body.conversation(),
                add_generation_prompt=body.add_generation_prompt,
                continue_final_message=body.continue_final_message,
                chat_template=gateway.service.chat_template,
            )
        encode_text = partial(engine.tokenizer.encode, add_special_tokens=body.special_tokens)
        ids = list(await tokenized(text or "", encode_text))
    except GenerationError as e:
        return _error(e)
    strings = list(engine.tokenizer.convert_ids_to_tokens(ids)) if body.return_token_strs else None
    answer = TokenizeResponse(len(ids), engine.max_model_len, ids, strings)
    return Response(encode(answer), media_type=JSON)


async def detokenize(request: Request) -> Response:
    gateway = gateway_of(request)
    try:
        body = decode_detokenize(await request.body())
        why = unknown_model(body.model, served_model_name(gateway.settings.engine))
        if why is not None:
            return Response(not_found(why), 404, media_type=JSON)
        engine = await gateway.holder.wait()
        check_token_ids(body.tokens, engine.vocabulary, "tokens")
    except GenerationError as e:
        return _error(e)
    return Response(encode(DetokenizeResponse(engine.decode(body.tokens))), media_type=JSON)


def _error(error: GenerationError) -> Response:
    status, body = error_of(error)
    return Response(body, status, media_type=JSON)


routes = [
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
]
