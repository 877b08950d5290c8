"""POST `/invocations` and `/predictions/{model_name}`: the LMI schema (lmi-invocations.md),
answered as gateway/http/invocations.py prepares it."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.http.embedding_answers import tei_body_of, tei_invocation
from gateway.http.invocations import LMI_BODY, LMI_ERROR, LMI_OK, answer
from gateway.http.openapi import OPENAI_ERRORS, Op
from gateway.http.prepared import to_response
from gateway.state import gateway_of


async def invocations(request: Request) -> Response:
    """LMI's; with an embedding model served, TEI's body (`is_tei_body`) is answered as TEI's
    SageMaker image does."""
    raw = await request.body()
    tei_body = tei_body_of(gateway_of(request), raw)
    if tei_body is not None:
        return to_response(await tei_invocation(gateway_of(request), tei_body))
    return to_response(await answer(request, raw, request.headers.get("accept")))


routes = [
    Route("/invocations", invocations, methods=["POST"]),
    Route("/predictions/{model_name}", invocations, methods=["POST"]),
]
operations = [
    Op("post", path, "LMI invocation", LMI_BODY, LMI_OK, LMI_ERROR, (*OPENAI_ERRORS, 424))
    for path in ("/invocations", "/predictions/{model_name}")
]
