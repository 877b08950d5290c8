"""GET `/metrics`: Prometheus text exposition of the app's own registry."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.http.openapi import TEXT, Op
from gateway.http.prepared import Whole, to_response
from gateway.state import gateway_of


async def metrics(request: Request) -> Response:
    registry = gateway_of(request).service.metrics.registry
    return to_response(Whole(200, generate_latest(registry), CONTENT_TYPE_LATEST))


routes = [Route("/metrics", metrics, methods=["GET"])]
operations = [Op("get", "/metrics", "Prometheus metrics", None, {"text/plain": TEXT}, None, ())]
