"""The route table: a protocol adds its routes module here and nowhere else."""

from starlette.routing import BaseRoute

from gateway.routes import batch_ws, control, health, rest_generate

ROUTES: list[BaseRoute] = [
    *health.routes,
    *batch_ws.routes,
    *rest_generate.routes,
    *control.routes,
]
