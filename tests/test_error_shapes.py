"""Refusals in the protocol's own shape, naming what the docs say they name: unreadable JSON on
the OpenAI routes (`param: null`, docs/OPENAI.md), a path no route serves (a path-like id
included) as the protocol's 404, and a control-protocol `reattach` on a busy connection naming
`$.type` whatever it holds (docs/CONTROL.md, "Reattaching")."""

from __future__ import annotations

import json
from collections.abc import Callable

import openai
import pytest
from control_client import config, control, until

from clients import CHAT, UNENDING, connect, web
from serving import RunningServer

# In a field the routes do not read: a typed field would be refused for its type first.
DEEP = b'{"model": "m", "x": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
TRAVERSAL = "..%2F..%2Fetc%2Fpasswd"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses"])
def test_json_nested_too_deeply_is_openais_400_for_the_whole_body(
    server: RunningServer, path: str
) -> None:
    answer = web.post(
        server.http + path, content=DEEP, headers={"content-type": "application/json"}
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] is None
    assert "nested too deeply" in error["message"]


def test_a_path_like_response_id_is_openais_404(server: RunningServer) -> None:
    api = openai.OpenAI(base_url=server.http + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.NotFoundError) as caught:
        api.responses.retrieve("../../etc/passwd")  # the client sends it as ..%2F..%2F...
    body = caught.value.body  # the error object, which Starlette's plain text was not
    assert isinstance(body, dict) and "/v1/responses/../../etc/passwd" in body["message"]
    for method in ("GET", "DELETE"):
        answer = web.request(method, f"{server.http}/v1/responses/{TRAVERSAL}")
        assert answer.status_code == 404, answer.text
        error = answer.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert "/v1/responses/../../etc/passwd" in error["message"]


@pytest.mark.parametrize(
    "method, path",
    [("DELETE", "/adapters/..%2Fx"), ("GET", "/models/m/adapters/..%2Fx"), ("PUT", "/adapters")],
)
def test_a_path_no_adapter_route_serves_is_djls_error(
    server: RunningServer, method: str, path: str
) -> None:
    answer = web.request(method, server.http + path)
    expected = 404 if method != "PUT" else 405
    assert answer.status_code == expected, answer.text
    body = answer.json()
    assert body["code"] == expected and body["message"]
    assert body["type"] in ("ResourceNotFoundException", "MethodNotAllowedException")


def test_an_unknown_api_path_is_ollamas_error(server: RunningServer) -> None:
    answer = web.get(server.http + "/api/no-such-route")
    assert answer.status_code == 404
    assert answer.headers["content-type"] == "application/json"
    assert set(answer.json()) == {"error"} and "/api/no-such-route" in answer.json()["error"]


@pytest.mark.parametrize("seconds", ["600", "0"], ids=["reattach-on", "reattach-off"])
def test_a_reattach_on_a_busy_connection_names_the_type_whatever_it_holds(
    make_server: Callable[..., RunningServer], seconds: str
) -> None:
    server = make_server(REATTACH_SECONDS=seconds)
    story = CHAT.format("Write a long story about a lighthouse.")
    with connect(server.ws + "/generate") as ws:
        ws.send(config(story, temperature=0, ignore_eos=True, max_tokens=UNENDING))
        own = until(ws, "init")[-1]["request_id"]
        for held in ({"request_id": "gen_000000000000"}, {}, {"request_id": 5}, {"received": -1}):
            ws.send(json.dumps({"type": "reattach", **held}))
            refused = until(ws, "error")[-1]
            assert refused["field"] == "$.type", (held, refused)
            assert refused["recoverable"] is True and refused["request_id"] == own
        ws.send(control("stop"))
        assert until(ws, "completion")[-1]["request_id"] == own
        if seconds != "0":  # nothing runs now: a reattach without its id names the id
            ws.send(json.dumps({"type": "reattach"}))
            assert until(ws, "error")[-1]["field"] == "$.request_id"
