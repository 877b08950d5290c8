"""POST `/invocations`, `/predictions/{model_name}` and `/models/{model_name}/invoke` (how
SageMaker's multi-model endpoints call a container's model): the LMI schema
(lmi-invocations.md), answered as gateway/http/invocations.py prepares it; a path naming an
embedding model, TEI's answer."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.http.embedding_answers import embedding_invocation
from gateway.http.invocations import LMI_BODY, LMI_ERROR, LMI_OK, answer
from gateway.http.openapi import OPENAI_ERRORS, Op
from gateway.http.prepared import to_response
from gateway.state import gateway_of


async def invocations(request: Request) -> Response:
    """LMI's; for an embedding model (the path naming one, or TEI's body while one is served)
    TEI's answer, as its SageMaker image gives it."""
    raw = await request.body()
    target = request.path_params.get("model_name")
    embedded = await embedding_invocation(gateway_of(request), raw, target)
    if embedded is not None:
        return to_response(embedded)
    accept = request.headers.get("accept")
    return to_response(await answer(request, raw, accept, target=target))


routes = [
    Route("/invocations", invocations, methods=["POST"]),
    Route("/predictions/{model_name}", invocations, methods=["POST"]),
    Route("/models/{model_name}/invoke", invocations, methods=["POST"]),
]
operations = [
    Op("post", path, "LMI invocation", LMI_BODY, LMI_OK, LMI_ERROR, (*OPENAI_ERRORS, 424))
    for path in ("/invocations", "/predictions/{model_name}", "/models/{model_name}/invoke")
]
