"""Every protocol has its row in each table a new protocol must touch (docs/ARCHITECTURE.md,
"Adding a protocol"), found here rather than by a request at run time: its priority class
(gateway/config/priorities.py; a missing row fails each of its requests), the error shape a
refusal on its paths answers in (gateway/edge/refusals.py; a missing row answers in another
protocol's shape) and how its clients present an API key (gateway/edge/api_keys.py; a way not
read refuses every key). Pure: no engine, no server.

`ROWS` is this test's own row per protocol: its paths (checked against the route table), its
error shape and its clients' ways of sending a key. A protocol added to protocols/names.py
fails `test_every_protocol_has_its_row_here` until it has one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.config.priorities import DEFAULT_CLASSES, MAX_PRIORITY, PriorityClasses, parse_classes
from gateway.edge.api_keys import presented_key
from gateway.edge.http_errors import status_of
from gateway.edge.refusals import error_body
from protocols import (
    anthropic_answers,
    cohere,
    control,
    lmi,
    ollama_answers,
    openai_answers,
    rest_generate,
    tgi,
)
from protocols.errors import ErrorKind, GenerationError, named
from protocols.names import Protocol

Shape = Callable[[GenerationError], tuple[int, bytes]]
KEY = "sk-test-protocol-tables-0"


def _rest(error: GenerationError) -> tuple[int, bytes]:
    return status_of(error.kind), rest_generate.encode_error(error)


def _control(error: GenerationError) -> tuple[int, bytes]:
    return status_of(error.kind), control.encode(control.error_message(error))


def _lmi(error: GenerationError) -> tuple[int, bytes]:
    status = lmi.lmi_status(error.kind)
    return status, lmi.payload_error(named(error), status, dynamic=False)


# How a client may present its key, as the ASGI scope its request arrives with.
WAYS: dict[str, Callable[[], dict[str, Any]]] = {
    "bearer": lambda: {"type": "http", "headers": [(b"authorization", f"Bearer {KEY}".encode())]},
    "x-api-key": lambda: {"type": "http", "headers": [(b"x-api-key", KEY.encode())]},
    "subprotocol": lambda: {"type": "websocket", "subprotocols": [f"bearer.{KEY}"]},
    "query": lambda: {"type": "websocket", "query_string": f"api_key={KEY}".encode()},
}
BROWSER = ("subprotocol", "query", "bearer")  # a WebSocket: a browser sends no headers
HTTP = ("bearer", "x-api-key")
BEARER = ("bearer",)  # openai's api_key=, huggingface_hub's token=, cohere's
OPENAI = openai_answers.error_of


@dataclass(frozen=True)
class Row:
    paths: tuple[str, ...]  # "METHOD /path" for HTTP, "WS /path" for a WebSocket
    shape: Shape | None  # None: a WebSocket, refused with a close (1008), never a body
    keys: tuple[str, ...]  # the ways its clients send a key (WAYS)


ROWS: dict[Protocol, Row] = {
    Protocol.WS: Row(("WS /ws",), None, BROWSER),
    Protocol.WS_EVENTS: Row(("WS /ws/events",), None, BROWSER),
    Protocol.CONTROL: Row(("WS /generate",), None, BROWSER),
    Protocol.API_GENERATE_ONE: Row(("POST /api/generate-one",), _rest, HTTP),
    Protocol.API_GENERATE_BATCH: Row(("POST /api/generate-batch",), _rest, HTTP),
    Protocol.V1_GENERATE: Row(("POST /v1/generate",), _control, HTTP),
    Protocol.LMI: Row(
        ("POST /invocations", "POST /predictions/m", "POST /models/m/invoke"), _lmi, HTTP
    ),
    # boto3's SigV4 owns Authorization: its callers add X-Api-Key (docs/SECURITY.md)
    Protocol.SAGEMAKER: Row(
        ("POST /endpoints/e/invocations", "POST /endpoints/e/invocations-response-stream"),
        _lmi,
        ("x-api-key",),
    ),
    Protocol.TGI: Row(
        ("POST /", "POST /generate", "POST /generate_stream", "GET /info"),
        tgi.error_body,
        BEARER,
    ),
    Protocol.OPENAI_CHAT: Row(("POST /v1/chat/completions",), OPENAI, BEARER),
    Protocol.OPENAI_COMPLETIONS: Row(("POST /v1/completions",), OPENAI, BEARER),
    Protocol.OPENAI_RESPONSES: Row(("POST /v1/responses", "GET /v1/responses/r"), OPENAI, BEARER),
    # anthropic's SDK: api_key= sends X-Api-Key, auth_token= a bearer token
    Protocol.ANTHROPIC_MESSAGES: Row(
        ("POST /v1/messages", "POST /v1/messages/count_tokens"),
        anthropic_answers.error_of,
        ("x-api-key", "bearer"),
    ),
    Protocol.COHERE_CHAT: Row(("POST /v2/chat",), cohere.error_of, BEARER),
    # the ollama clients' headers= (OLLAMA_API_KEY), langchain-ollama's client_kwargs
    Protocol.OLLAMA: Row(
        (
            "POST /api/chat",
            "POST /api/generate",
            "POST /api/embed",
            "GET /api/tags",
            "GET /api/ps",
            "POST /api/show",
            "POST /api/pull",
        ),
        ollama_answers.error_of,
        BEARER,
    ),
}
REFUSED = GenerationError(ErrorKind.UNAUTHORIZED, "no key", "authorization")


def brief(answer: tuple[int, bytes]) -> tuple[int, str]:
    """An error answer as compared: its status and body, less the id Cohere's draws afresh."""
    status, body = answer
    document = json.loads(body)
    document.pop("id", None)
    return status, json.dumps(document, sort_keys=True)


def test_every_protocol_has_its_row_here() -> None:
    missing = set(Protocol) - set(ROWS)
    assert not missing, (
        f"{sorted(missing)}: give each its row in ROWS, and in each table docs/ARCHITECTURE.md's "
        "'Adding a protocol' lists"
    )


def test_every_protocol_has_a_priority_class() -> None:
    assert set(DEFAULT_CLASSES) == set(Protocol)
    classes = PriorityClasses({})
    assert all(0 <= classes.of(p) <= MAX_PRIORITY for p in Protocol)
    # PRIORITY_<PROTOCOL> sets each one
    assert parse_classes({f"PRIORITY_{p.name}": "3" for p in Protocol}) == dict.fromkeys(
        Protocol, 3
    )


def test_every_protocols_paths_are_served() -> None:
    from starlette.routing import Match

    from gateway.routes import ROUTES  # it imports vLLM: not at collection

    for protocol, row in ROWS.items():
        for entry in row.paths:
            method, path = entry.split(" ")
            scope: dict[str, Any] = {"path": path, "path_params": {}}
            if method == "WS":
                scope["type"] = "websocket"
            else:
                scope |= {"type": "http", "method": method}
            assert any(route.matches(scope)[0] == Match.FULL for route in ROUTES), (
                protocol,
                entry,
            )


def test_a_refusal_on_a_protocols_path_is_in_its_shape() -> None:
    shapes = {row.shape for row in ROWS.values() if row.shape is not None}
    # The shapes differ, so the comparison below tells one from another.
    assert len({brief(shape(REFUSED)) for shape in shapes}) == len(shapes)
    for protocol, row in ROWS.items():
        if row.shape is None:
            continue
        for entry in row.paths:
            path = entry.split(" ")[1]
            assert brief(error_body(path, REFUSED)) == brief(row.shape(REFUSED)), (protocol, path)


def test_each_way_a_protocols_clients_send_a_key_is_read() -> None:
    for protocol, row in ROWS.items():
        assert row.keys, protocol
        for way in row.keys:
            assert presented_key(WAYS[way]()) == KEY, (protocol, way)
