"""The route table: a protocol adds its routes module here and nowhere else."""

from starlette.routing import BaseRoute

from gateway.routes import (
    adapters,
    batch_ws,
    control,
    health,
    lmi,
    lmi_adapters,
    metrics,
    openai,
    openapi,
    responses,
    rest_generate,
    sagemaker,
    tgi,
    tokenize,
    ui,
    ws_events,
)

_MODULES = (
    health,
    metrics,
    batch_ws,
    rest_generate,
    control,
    ws_events,
    lmi,
    sagemaker,
    tgi,
    openai,
    responses,
    adapters,
    lmi_adapters,
    tokenize,
    openapi,
    ui,
)
ROUTES: list[BaseRoute] = [route for module in _MODULES for route in module.routes]
