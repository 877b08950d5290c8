"""GET `/openapi.json`: the OpenAPI 3.1 document of every HTTP route (gateway/http/openapi.py),
made once from the operations the route table gathers."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.http.openapi import Op, document
from gateway.http.prepared import JSON, Whole, to_response
from protocols.rest_generate import ErrorBody

routes: list[Route] = []  # served(...), once the route table gathered every operation
operations = [
    Op("get", "/openapi.json", "This document", None, {JSON: dict[str, Any]}, ErrorBody, (401,)),
]


def served(every: Iterable[Op]) -> list[Route]:
    """The route that answers the document of `every` operation."""
    answer = Whole(200, document(every), JSON)

    async def openapi(request: Request) -> Response:
        return to_response(answer)

    return [Route("/openapi.json", openapi, methods=["GET"])]
