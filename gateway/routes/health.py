"""GET `/health` and `/ping`: 200 once the engine is ready; 503 while it loads, if it failed,
and from the moment a drain (SIGTERM) begins, so a balancer moves away at once. A Redis
continuation store that cannot be reached makes it 200 `degraded`, naming the store. The status
is the chat model's; where embedding models are served, `models` gives each model's own (one
whose engine is rebuilt or failed leaves the answer 200 while the chat model serves: its own
requests are answered 503 meanwhile)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.engine_path.model_registry import ModelRegistry
from gateway.http.openapi import Op
from gateway.http.prepared import JSON, Whole, to_response
from gateway.state import gateway_of
from protocols.health import Health, ModelHealth, encode_health


async def health(request: Request) -> Response:
    gateway = gateway_of(request)
    model = gateway.model
    if gateway.drain.draining:
        return to_response(Whole(503, encode_health(Health("draining")), JSON))
    status = Health(*model.status(), models=_models(gateway.models))
    if model.ready and (problem := await gateway.batches.store.problem()) is not None:
        # only continuation by request_id fails: keep 200
        status = Health("degraded", problem, status.models)
    return to_response(Whole(200 if model.ready else 503, encode_health(status), JSON))


def _models(registry: ModelRegistry) -> list[ModelHealth] | None:
    if not registry.embedding_models() and len(registry.chats) == 1:
        return None
    return [ModelHealth(e.name, e.task, e.status, e.error) for e in registry.entries()]


routes = [Route("/health", health, methods=["GET"]), Route("/ping", health, methods=["GET"])]
operations = [
    Op("get", path, "Ready (200) or not (503)", None, {JSON: Health}, Health, (503,))
    for path in ("/health", "/ping")
]
