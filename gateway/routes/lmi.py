"""POST `/invocations` and `/predictions/{model_name}`: the LMI schema (lmi-invocations.md),
answered as gateway/http/invocations.py prepares it."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.http.invocations import LMI_BODY, LMI_ERROR, LMI_OK, answer
from gateway.http.openapi import OPENAI_ERRORS, Op
from gateway.http.prepared import to_response


async def invocations(request: Request) -> Response:
    return to_response(await answer(request, await request.body(), request.headers.get("accept")))


routes = [
    Route("/invocations", invocations, methods=["POST"]),
    Route("/predictions/{model_name}", invocations, methods=["POST"]),
]
operations = [
    Op("post", path, "LMI invocation", LMI_BODY, LMI_OK, LMI_ERROR, (*OPENAI_ERRORS, 424))
    for path in ("/invocations", "/predictions/{model_name}")
]
