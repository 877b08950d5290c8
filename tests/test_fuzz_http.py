"""Schemathesis against the real server, from the served `/openapi.json`: no 5xx, every answer
(errors included) in its route's documented status, media type and shape, and the server
healthy afterwards. Then every numeric field of every body past its bounds: the protocol's
4xx naming the field. Then bodies no schema describes: nesting 50,000 deep and invalid UTF-8.

Generation is kept tiny: token budgets in a generated body are cut to a few tokens and added
where absent, so every example costs the engine a few steps at most.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NamedTuple

import httpx
import jsonschema  # type: ignore[import-untyped]
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from numbers_past_bounds import (
    Place,
    Schema,
    field_name,
    numeric_places,
    past_bounds,
    resolved,
    with_number,
)
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.schemas import APIOperation
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)
from starlette.routing import Route

from clients import web
from serving import RunningServer

TOKENS = 3  # the most any example may generate, per sequence
SEQUENCES = 2  # n, best_of, num_beams
BUDGETS = {"max_new_tokens", "max_tokens", "max_completion_tokens", "max_output_tokens"}
COUNTS = {"n", "best_of", "num_beams"}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
SSE_ERRORS = {"/", "/generate_stream"}
SSE = "text/event-stream"
# Invalid data must be refused with a 4xx; LMI (and SageMaker over it) refuses with 424.
CONFIG = schemathesis.Config.from_dict(
    {
        "checks": {
            "negative_data_rejection": {
                # 403: the adapter admin routes refuse a key not of ADMIN_API_KEYS first
                "expected-statuses": [400, 401, 403, 404, 409, 413, 415, 422, 424, 429]
            }
        }
    }
)
DEEP = 50_000
Operation = APIOperation[Any, Any, Any, Any]
UNFUZZED = {("get", "/openapi.json")}  # schemathesis skips the document itself
# Refused (403) before their body is read on a server without ADMIN_API_KEYS, as the shared one
# is: tests/test_adapters.py sends their numbers past bounds with an admin key.
ADMIN_BODIES = {"/v1/load_lora_adapter", "/v1/unload_lora_adapter"}


def _cut(value: Any) -> Any:
    """Every token budget and sequence count, wherever it is, made small."""
    if isinstance(value, list):
        return [_cut(v) for v in value]
    if not isinstance(value, dict):
        return value
    cut: dict[str, Any] = {}
    for key, v in value.items():
        if key in BUDGETS and (v is None or (type(v) is int and v > TOKENS)):
            v = TOKENS  # null too: it means the route's default, the whole context for a chat
        elif key in COUNTS and type(v) is int and v > SEQUENCES:
            v = SEQUENCES
        cut[key] = _cut(v)
    return cut


def _budgeted(path: str, body: Any) -> Any:
    """The body with a small token budget where it gives none (each route's default is
    larger: the context itself for a chat)."""
    body = _cut(body)
    if not isinstance(body, dict):
        return body
    if "messages" in body or path in ("/v1/completions", "/v1/generate", "/v1/responses"):
        if not BUDGETS & set(body):
            body["max_output_tokens" if path == "/v1/responses" else "max_tokens"] = TOKENS
        return body
    nested = "generation_config" if path.startswith("/api/") else "parameters"
    inner = body.get(nested)
    if inner is None:  # null asks for the route's default budget too
        inner = {}
    if isinstance(inner, dict) and "max_new_tokens" not in inner:
        body[nested] = {**inner, "max_new_tokens": TOKENS}
    return body


# Examples per operation: valid bodies, then bodies that break the schema. No shrinking: a
# failure is reported as generated, with the curl command that reproduces it.
EXAMPLES = {GenerationMode.POSITIVE: 25, GenerationMode.NEGATIVE: 15}


def _fuzz(operation: Operation, mode: GenerationMode, base_url: str) -> None:
    @settings(
        max_examples=EXAMPLES[mode],
        deadline=None,
        database=None,
        derandomize=True,  # the same examples on every run: a CI failure reproduces
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: schemathesis.Case[Any]) -> None:
        case.body = _budgeted(operation.path, case.body)
        checks = CHECKS
        if operation.path in SSE_ERRORS:  # TGI: a stream's refusal is a 200 event
            checks = [check for check in CHECKS if check is not negative_data_rejection]
        # No timeout (schemathesis' default is 10 s): a loaded machine's engine may take longer.
        case.call_and_validate(base_url=base_url, checks=checks, timeout=None)

    run()


def _described(error: BaseException) -> str:
    if isinstance(error, BaseExceptionGroup):
        return f"{error}: " + "; ".join(_described(e) for e in error.exceptions)
    return f"{type(error).__name__}: {error}"


def _documented(server: RunningServer) -> set[tuple[str, str]]:
    """(method, path) of every operation the served /openapi.json describes."""
    paths = web.get(server.http + "/openapi.json").json()["paths"]
    return {(method, path) for path, operations in paths.items() for method in operations}


def test_every_http_route_of_the_app_is_in_the_openapi_document(server: RunningServer) -> None:
    """The app's own route table (gateway/app.py) against the served document: a route added
    without its description is listed here. WebSocket routes are not HTTP operations (the
    document says so), and HEAD is Starlette's own beside each GET."""
    routes = {
        (method.lower(), route.path)
        for route in server.app.routes
        if isinstance(route, Route)
        for method in route.methods or ()
        if method != "HEAD"
    }
    documented = _documented(server)
    missing = sorted(routes - documented)
    assert not missing, f"routes missing from /openapi.json: {missing}"
    assert documented <= routes, sorted(documented - routes)  # nothing described is not served


@pytest.mark.long  # schemathesis's cases for every operation: make test-all
def test_every_route_answers_as_documented(server: RunningServer) -> None:
    """schemathesis' pytest integration (lazy schemas) fails on pytest 9, hence a loop."""
    api = schemathesis.openapi.from_url(server.http + "/openapi.json", config=CONFIG)
    failures: list[str] = []
    operations: list[Operation] = []
    for result in api.get_all_operations():
        assert isinstance(result, Ok), result.err()  # the served document is valid
        operations.append(result.ok())
    fuzzed = {(operation.method, operation.path) for operation in operations}
    assert fuzzed == _documented(server) - UNFUZZED, sorted(fuzzed ^ _documented(server))
    for operation in operations:
        for mode in EXAMPLES:
            bodiless = "requestBody" not in operation.definition.raw
            if mode is GenerationMode.NEGATIVE and bodiless:
                continue  # nothing of a GET (or a POST with no body) can break its schema
            try:
                _fuzz(operation, mode, server.http)
            except (Exception, BaseExceptionGroup) as e:  # schemathesis' FailureGroup
                failures.append(f"{operation.label} ({mode.value}): {_described(e)}")
    assert not failures, "\n\n".join(failures)


# --- numbers past their bounds: every numeric field of every body ----------------------------

HI = [{"role": "user", "content": "Hi"}]
# Each body schema's smallest valid body (a one-token budget), a part of which a number replaces.
VALID: dict[str, dict[str, Any]] = {
    "ChatRequest": {"messages": HI, "max_tokens": 1},
    "CompletionRequest": {"prompt": "Hi", "max_tokens": 1},
    "TokenizeRequest": {"prompt": "Hi"},
    "EmbeddingsBody": {"input": "Hi"},
    "DetokenizeRequest": {"tokens": [1]},
    "protocols.lmi._Payload": {"inputs": "Hi", "parameters": {"max_new_tokens": 1}},
    "protocols.tgi._Payload": {"inputs": "Hi", "parameters": {"max_new_tokens": 1}},
    "_OnePayload": {"request_id": "n", "prompt": "Hi", "generation_config": {"max_new_tokens": 1}},
    "_BatchPayload": {
        "prompts": [{"request_id": "n", "prompt": "Hi"}],
        "generation_config": {"max_new_tokens": 1},
    },
    "RestRequest": {"prompt": "Hi", "max_tokens": 1},
    "ResponsesRequest": {"input": "Hi", "max_output_tokens": 1},
    "MessagesRequest": {"model": "SmolLM2-135M-Instruct", "messages": HI, "max_tokens": 1},
    "CountTokensRequest": {"model": "SmolLM2-135M-Instruct", "messages": HI},
    "CohereChatRequest": {"model": "SmolLM2-135M-Instruct", "messages": HI, "max_tokens": 1},
    "protocols.tei.EmbedBody": {"inputs": "Hi"},
    "EmbedAllBody": {"inputs": "Hi"},
    "SimilarityBody": {"inputs": {"source_sentence": "Hi", "sentences": ["Hi"]}},
    "protocols.tei.RerankBody": {"query": "Hi", "texts": ["Hi"]},
    "protocols.vllm_pooling.RerankBody": {"query": "Hi", "documents": ["Hi"]},
    "PoolingBody": {"input": "Hi"},
    "ScoreBody": {"text_1": "Hi", "text_2": "Hi"},
    "protocols.cohere.EmbedBody": {"texts": ["Hi"]},
    "OllamaChatRequest": {"model": "SmolLM2-135M-Instruct", "messages": HI, "stream": False},
    "OllamaGenerateRequest": {"model": "SmolLM2-135M-Instruct", "prompt": "Hi", "stream": False},
    "OllamaEmbedRequest": {"model": "all-MiniLM-L6-v2", "input": "Hi"},
    "OllamaEmbeddingsRequest": {"model": "all-MiniLM-L6-v2", "prompt": "Hi"},
    "OllamaShowRequest": {"model": "SmolLM2-135M-Instruct"},
}


class Numeric(NamedTuple):
    """A numeric field of a body schema: where it is, its schema, the routes taking it."""

    body: str
    place: Place
    schema: Schema
    routes: tuple[str, ...]


def _numeric_fields(doc: Schema) -> list[Numeric]:
    components = doc["components"]["schemas"]
    routes: dict[str, list[str]] = {}
    for path, operations in doc["paths"].items():
        body = operations.get("post", {}).get("requestBody")
        if body is None or path in ADMIN_BODIES:
            continue
        schema = body["content"]["application/json"]["schema"]
        for alternative in schema.get("oneOf", [schema]):
            name, _ = resolved(alternative, components)
            assert name in VALID, f"{path}: no valid body of {name} in VALID"
            routes.setdefault(name, []).append(path)
    fields: dict[tuple[str, Place], Numeric] = {}
    for name, paths in routes.items():
        for place, schema in numeric_places({"$ref": f"#/{name}"}, components):
            fields.setdefault((name, place), Numeric(name, place, schema, tuple(paths)))
    return list(fields.values())


def _refusal(doc: Schema, path: str, answer: httpx.Response) -> str:
    """The refusal's text, once it is a documented 4xx in the route's error shape (a TGI
    stream's: its one error event)."""
    documented = doc["paths"][path]["post"]["responses"]
    media = answer.headers.get("content-type", "").split(";")[0]
    if answer.status_code == 200 and path in SSE_ERRORS and media == SSE:
        event = json.loads(answer.text.strip().removeprefix("data:"))
        assert event.get("error_type") == "validation", event
        return answer.text
    assert 400 <= answer.status_code < 500, (answer.status_code, answer.text)
    assert str(answer.status_code) in documented, (answer.status_code, answer.text)
    schema = documented[str(answer.status_code)]["content"][media]["schema"]
    validator = jsonschema.Draft202012Validator({**schema, "components": doc["components"]})
    validator.validate(answer.json())
    return answer.text


def test_every_number_past_its_bounds_is_the_protocols_4xx_naming_it(
    server: RunningServer,
) -> None:
    """Every numeric field of every documented body, past its bounds, on the routes taking
    that body: the fields take turns through the numbers (the nearest past each bound, 2^64,
    -2^63 - 1, +-1e308, +-1e400) and through the routes, one request each.
    tests/test_fuzz_decoders.py sends every field every one of them, and drawn ones."""
    doc = web.get(server.http + "/openapi.json").json()
    fields = _numeric_fields(doc)
    assert len(fields) >= 90, [f"{f.body}: {field_name(f.place)}" for f in fields]
    failures: list[str] = []
    with web.client(base_url=server.http) as client:
        for turn, field in enumerate(fields):
            route = field.routes[turn % len(field.routes)]
            try:
                explicit, _ = past_bounds(field.schema)
                number = explicit[turn % len(explicit)]
                body = with_number(VALID[field.body], field.place, number)
                path = route.replace("{model_name}", "any").replace("{name}", "any")
                text = _refusal(doc, route, client.post(path, content=body))
                assert field_name(field.place) in text, (number, text)
            except (AssertionError, KeyError, jsonschema.ValidationError) as e:
                failures.append(f"{route} {field_name(field.place)}: {_described(e)}")
    assert not failures, "\n\n".join(failures)


# --- what no schema describes ----------------------------------------------------------------

UNREADABLE = {
    "deep": b'{"inputs": ' + b"[" * DEEP + b"]" * DEEP + b"}",
    "utf8": b'{"inputs": "\xff\xfe\xfd", "prompt": "\xff\xfe\xfd"}',
}
CHAT_UTF8 = b'{"messages": [{"role": "user", "content": "\xff\xfe\xfd"}]}'
REASONS = {"deep": "nested too deeply", "utf8": "not valid UTF-8"}


def _lmi(answer: httpx.Response) -> str:
    body = answer.json()
    assert answer.status_code == 424 and body["code"] == 424, body
    assert str(body["error"]).endswith(" - at `$`"), body
    return str(body["error"])


def _sagemaker(answer: httpx.Response) -> str:
    body = answer.json()
    assert answer.status_code == 424 and body["OriginalStatusCode"] == 424, body
    return str(body["OriginalMessage"])


def _tgi(answer: httpx.Response) -> str:
    body = answer.json()
    assert answer.status_code == 422 and body["error_type"] == "validation", body
    return str(body["error"])


def _tgi_stream(answer: httpx.Response) -> str:
    assert answer.status_code == 200, answer.text  # TGI: a stream's error is an event
    event = json.loads(answer.text.removeprefix("data:").strip())
    assert event["error_type"] == "validation", event
    return str(event["error"])


def _openai(answer: httpx.Response) -> str:
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["type"] == "invalid_request_error", error
    return str(error["message"])


def _rest(answer: httpx.Response) -> str:
    body = answer.json()
    assert answer.status_code == 422 and body["field"] == "$", body
    assert body["type"] == "invalid_request", body
    return str(body["error"])


def _control(answer: httpx.Response) -> str:
    body = answer.json()
    assert answer.status_code == 422 and body["type"] == "error", body
    assert body["error"] == "invalid_request" and body["field"] == "$", body
    return str(body["message"])


ROUTES: dict[str, Callable[[httpx.Response], str]] = {
    "/invocations": _lmi,
    "/predictions/any": _lmi,
    "/endpoints/any/invocations": _sagemaker,
    "/endpoints/any/invocations-response-stream": _sagemaker,
    "/generate": _tgi,
    "/generate_stream": _tgi_stream,
    "/v1/chat/completions": _openai,
    "/v1/completions": _openai,
    "/api/generate-one": _rest,
    "/api/generate-batch": _rest,
    "/v1/generate": _control,
}


@pytest.mark.parametrize("kind", sorted(UNREADABLE))
@pytest.mark.parametrize("path", list(ROUTES))
def test_unreadable_bodies_are_the_protocols_4xx(
    server: RunningServer, path: str, kind: str
) -> None:
    body = CHAT_UTF8 if (path, kind) == ("/v1/chat/completions", "utf8") else UNREADABLE[kind]
    answer = web.post(server.http + path, content=body)
    message = ROUTES[path](answer)
    assert f"Malformed JSON: {REASONS[kind]}" in message, message


@pytest.mark.parametrize("kind", sorted(UNREADABLE))
def test_unreadable_bodies_on_tgis_compat_route(server: RunningServer, kind: str) -> None:
    answer = web.post(server.http + "/", content=UNREADABLE[kind])
    assert f"Malformed JSON: {REASONS[kind]}" in _tgi(answer)


def test_healthy_afterwards(server: RunningServer, idle_engine: Callable[[], None]) -> None:
    """Last in this file: no engine request outlived its client, and the server serves."""
    idle_engine()
    assert web.get(server.http + "/health").status_code == 200
