"""ALLOWED_ORIGINS (docs/SECURITY.md): which web pages may call the gateway from a browser."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from websockets.exceptions import ConnectionClosed

from clients import connect, web
from serving import RunningServer

PAGE, STRANGER = "https://chat.example.com", "https://evil.example.net"
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}


def test_an_allowed_page_gets_cors_and_its_preflight_answered(
    make_server: Callable[..., RunningServer],
) -> None:
    server = make_server(ALLOWED_ORIGINS=PAGE)
    preflight = web.options(
        server.http + "/v1/chat/completions",
        headers={
            "Origin": PAGE,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == PAGE
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert "authorization" in preflight.headers["access-control-allow-headers"]
    answer = web.post(server.http + "/v1/chat/completions", json=CHAT, headers={"Origin": PAGE})
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-origin"] == PAGE
    assert "retry-after" in answer.headers["access-control-expose-headers"]
    with connect(server.ws + "/ws", origin=PAGE) as ws:
        ws.send('{"prompts": []}')
        assert ws.recv()


def test_another_page_is_refused_before_any_route_runs(server: RunningServer) -> None:
    preflight = web.options(
        server.http + "/generate",
        headers={"Origin": STRANGER, "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status_code == 403
    assert "access-control-allow-origin" not in preflight.headers
    # A "simple" request needs no preflight: it is refused too, in the protocol's shape.
    tgi = web.post(
        server.http + "/generate",
        content=b'{"inputs": "Hi"}',
        headers={"Origin": STRANGER, "Content-Type": "text/plain"},
    )
    assert tgi.status_code == 403 and "ALLOWED_ORIGINS" in tgi.json()["error"]
    with (
        pytest.raises(ConnectionClosed) as closed,
        connect(server.ws + "/ws", origin=STRANGER) as ws,
    ):
        ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


def test_no_origin_and_the_gateways_own_pages_pass(server: RunningServer) -> None:
    own = server.http.removeprefix("http://")
    for headers in ({}, {"Origin": f"http://{own}"}):
        answer = web.post(server.http + "/v1/chat/completions", json=CHAT, headers=headers)
        assert answer.status_code == 200, answer.text
        assert "access-control-allow-origin" not in answer.headers
