"""The route table: a protocol adds its routes module here and nowhere else. Each module has
its `routes` and the OpenAPI `operations` that describe its HTTP routes."""

from starlette.routing import BaseRoute

from gateway.http.openapi import Op
from gateway.routes import (
    adapters,
    anthropic,
    batch_ws,
    cohere_chat,
    cohere_embed,
    control,
    embeddings,
    health,
    lmi,
    lmi_adapters,
    metrics,
    model_management,
    ollama,
    openai,
    openapi,
    responses,
    rest_generate,
    sagemaker,
    tei,
    tgi,
    tokenize,
    ui,
    vllm_pooling,
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
    embeddings,
    tei,
    vllm_pooling,
    cohere_embed,
    responses,
    anthropic,
    cohere_chat,
    ollama,
    adapters,
    lmi_adapters,
    model_management,
    tokenize,
    openapi,
    ui,
)
OPERATIONS: list[Op] = [op for module in _MODULES for op in module.operations]
# The document's route serves what every module declares, its own operation included.
ROUTES: list[BaseRoute] = [
    *(route for module in _MODULES for route in module.routes),
    *openapi.served(OPERATIONS),
]
