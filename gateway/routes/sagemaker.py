"""The SageMaker runtime paths that boto3's `sagemaker-runtime` client calls.

POST `/endpoints/{name}/invocations` (InvokeEndpoint) and
`/endpoints/{name}/invocations-response-stream` (InvokeEndpointWithResponseStream) serve the
LMI handler, as SageMaker fronts an LMI container: an error answer becomes a 424 `ModelError`
carrying the handler's status and body; a stream becomes event-stream PayloadPart frames, and a
generation that fails mid-stream ends with a ModelStreamError frame. The request's custom
attributes come back in the response. The endpoint name is not checked; boto3's TargetModel
(`X-Amzn-SageMaker-Target-Model`) naming an embedding model is answered by it, in TEI's shape.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.http.embedding_answers import embedding_invocation
from gateway.http.invocations import LMI_BODY, answer
from gateway.http.openapi import Op
from gateway.http.prepared import CLIENT_GONE, JSON, Chunk, Streamed, Whole, to_response
from gateway.http.streaming import until_disconnect
from gateway.state import gateway_of
from protocols.eventstream import (
    MEDIA_TYPE,
    ModelError,
    model_error,
    model_stream_error,
    payload_part,
)
from protocols.lmi import PayloadError
from protocols.names import Protocol

CUSTOM_ATTRIBUTES = "X-Amzn-SageMaker-Custom-Attributes"
# A multi-model endpoint's model (boto3's TargetModel): an embedding model the registry serves
# is answered by it, a chat model by that model (gateway/http/invocations.py's `_target`).
TARGET_MODEL = "X-Amzn-SageMaker-Target-Model"
VARIANT = {"X-Amzn-Invoked-Production-Variant": "AllTraffic"}


def _headers(request: Request) -> dict[str, str]:
    headers = dict(VARIANT)
    attributes = request.headers.get(CUSTOM_ATTRIBUTES)
    if attributes is not None:
        headers[CUSTOM_ATTRIBUTES] = attributes
    return headers


def _model_error(whole: Whole) -> Response:
    if whole is CLIENT_GONE:
        return to_response(whole)
    body = model_error(whole.status, whole.body)
    return to_response(Whole(424, body, JSON, {"X-Amzn-ErrorType": "ModelError"}))


async def _collect(chunks: AsyncIterator[Chunk]) -> bytes:
    return b"".join([chunk.data async for chunk in chunks])


async def _embedded(request: Request, raw: bytes) -> Whole | None:
    """The answer of an embedding model TargetModel names (TEI's SageMaker shape)."""
    target = request.headers.get(TARGET_MODEL)
    return await embedding_invocation(gateway_of(request), raw, target)


async def invoke_endpoint(request: Request) -> Response:
    accept, raw = request.headers.get("accept"), await request.body()
    embedded = await _embedded(request, raw)
    if embedded is not None:
        if embedded.status >= 400:
            return _model_error(embedded)
        return to_response(embedded, _headers(request))
    target = request.headers.get(TARGET_MODEL)
    prepared = await answer(request, raw, accept, Protocol.SAGEMAKER, target)
    if isinstance(prepared, Streamed):  # a whole answer was asked for: read the stream out
        try:
            body = await until_disconnect(request, _collect(prepared.chunks))
        finally:
            await prepared.close()
        if body is None:
            return to_response(CLIENT_GONE)
        prepared = Whole(200, body, prepared.media_type)
    if prepared.status >= 400:
        return _model_error(prepared)
    return to_response(prepared, _headers(request))


async def _frames(chunks: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
    async for chunk in chunks:
        if chunk.failure is not None:
            yield Chunk(model_stream_error(chunk.failure), chunk.failure)
            return
        yield Chunk(payload_part(chunk.data))


async def invoke_endpoint_with_response_stream(request: Request) -> Response:
    accept, raw = request.headers.get("x-amzn-sagemaker-accept"), await request.body()
    prepared = await _embedded(request, raw) or await answer(
        request, raw, accept, Protocol.SAGEMAKER, request.headers.get(TARGET_MODEL)
    )
    headers = _headers(request) | {"X-Amzn-SageMaker-Content-Type": prepared.media_type}
    if isinstance(prepared, Whole):
        if prepared.status >= 400:
            return _model_error(prepared)
        return to_response(Whole(200, payload_part(prepared.body), MEDIA_TYPE, headers))
    return to_response(Streamed(MEDIA_TYPE, _frames(prepared.chunks), prepared.close, headers))


routes = [
    Route("/endpoints/{name}/invocations", invoke_endpoint, methods=["POST"]),
    Route(
        "/endpoints/{name}/invocations-response-stream",
        invoke_endpoint_with_response_stream,
        methods=["POST"],
    ),
]
ERROR = (ModelError, PayloadError)  # 401 and 413 come before the handler
operations = [
    Op(
        "post",
        "/endpoints/{name}/invocations",
        "SageMaker runtime",
        LMI_BODY,
        {"*/*": {}},
        ERROR,
        (401, 413, 424),
    ),
    Op(
        "post",
        "/endpoints/{name}/invocations-response-stream",
        "SageMaker runtime",
        LMI_BODY,
        {MEDIA_TYPE: {"type": "string", "contentEncoding": "binary"}},
        ERROR,
        (401, 413, 424),
    ),
]
