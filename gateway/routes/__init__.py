"""The route table: a protocol adds its routes module here and nowhere else."""

from starlette.routing import BaseRoute

from gateway.routes import (
    batch_ws,
    control,
    health,
    lmi,
    metrics,
    rest_generate,
    sagemaker,
    tgi,
    ui,
    ws_events,
)

ROUTES: list[BaseRoute] = [
    *health.routes,
    *metrics.routes,
    *batch_ws.routes,
    *rest_generate.routes,
    *control.routes,
    *ws_events.routes,
    *lmi.routes,
    *sagemaker.routes,
    *tgi.routes,
    *ui.routes,
]
