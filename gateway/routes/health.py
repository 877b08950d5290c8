"""GET `/health` and `/ping`: 200 once the engine is ready; 503 while it loads, if it failed,
and from the moment a drain (SIGTERM) begins, so a balancer moves away at once. A Redis
continuation store that cannot be reached makes it 200 `degraded`, naming the store."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.state import gateway_of


class Health(msgspec.Struct, omit_defaults=True):
    status: str
    error: str | None = None


_ENCODER = msgspec.json.Encoder()


async def health(request: Request) -> Response:
    gateway = gateway_of(request)
    holder = gateway.holder
    if gateway.drain.draining:
        return Response(_ENCODER.encode(Health("draining")), 503, media_type="application/json")
    status = Health(*holder.describe())
    if holder.ready and (problem := await gateway.batches.store.problem()) is not None:
        status = Health("degraded", problem)  # only continuation by request_id fails: keep 200
    body = _ENCODER.encode(status)
    return Response(body, 200 if holder.ready else 503, media_type="application/json")


routes = [Route("/health", health, methods=["GET"]), Route("/ping", health, methods=["GET"])]
