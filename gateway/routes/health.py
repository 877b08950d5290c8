"""GET `/health` and `/ping`: 200 once the engine is ready; 503 while it loads, if it failed,
and from the moment a drain (SIGTERM) begins, so a balancer moves away at once. A Redis
continuation store that cannot be reached makes it 200 `degraded`, naming the store."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.http.openapi import Op
from gateway.http.prepared import JSON, Whole, to_response
from gateway.state import gateway_of
from protocols.health import Health, encode_health


async def health(request: Request) -> Response:
    gateway = gateway_of(request)
    model = gateway.model
    if gateway.drain.draining:
        return to_response(Whole(503, encode_health(Health("draining")), JSON))
    status = Health(*model.status())
    if model.ready and (problem := await gateway.batches.store.problem()) is not None:
        status = Health("degraded", problem)  # only continuation by request_id fails: keep 200
    return to_response(Whole(200 if model.ready else 503, encode_health(status), JSON))


routes = [Route("/health", health, methods=["GET"]), Route("/ping", health, methods=["GET"])]
operations = [
    Op("get", path, "Ready (200) or not (503)", None, {JSON: Health}, Health, (503,))
    for path in ("/health", "/ping")
]
