"""Every WebSocket route fed Hypothesis frames (text and binary), invalid UTF-8, oversize
messages and control messages out of order, on the real server: each gets its protocol's
error message or a close with a proper code, never a server exception or a hang, and the
server stays healthy.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from control_client import config, control
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.connection import Connection

from clients import connect, web
from serving import RunningServer

Frame = str | bytes
TERMINAL = {"COMPLETE", "ERROR"}
POLICY_VIOLATION, INVALID_DATA, TOO_BIG = 1008, 1007, 1009

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.sampled_from(["START", "config", "control", "stop", "resume", "prompts", "id"])
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=12,
)
FRAMES: st.SearchStrategy[Frame] = st.one_of(
    JSON.map(json.dumps),
    st.text(max_size=40),
    st.binary(max_size=40),
    JSON.map(lambda doc: json.dumps(doc).encode()),
)
FUZZ = settings(
    max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)


def _batch_answered(ws: Connection) -> None:
    """`/ws`: frames (JSON arrays of events) until every request_id has its terminal event."""
    open_ids: set[Any] = set()
    while True:
        frame = json.loads(ws.recv())
        assert isinstance(frame, list) and frame, frame
        for event in frame:
            if event["type"] in TERMINAL:
                open_ids.discard(event.get("request_id"))
                if event.get("request_id") == "":
                    return  # the payload as a whole was refused: no id to report
            else:
                open_ids.add(event["request_id"])
        if not open_ids:
            return


def _events_answered(ws: Connection) -> None:
    """`/ws/events`: until every START echoed has a COMPLETE or an ERROR."""
    open_ids: set[Any] = set()
    errors = 0
    while True:
        frame = json.loads(ws.recv())
        assert isinstance(frame, list) and frame, frame
        for event in frame:
            if event["type"] == "START":
                open_ids.add(event["id"])
            elif event["type"] in TERMINAL:
                errors += event["type"] == "ERROR"
                open_ids.discard(event["id"])
        if not open_ids and (errors or frame[0]["type"] == "COMPLETE"):
            return


def _control_answered(ws: Connection) -> None:
    """`/generate`: a first message that is no config is an error, then close 1008; a bad
    config is an error the client may correct."""
    first = json.loads(ws.recv())
    if first["type"] == "error" and first["recoverable"]:
        return
    if first["type"] == "error":
        try:
            ws.recv()
        except ConnectionClosed as closed:
            assert closed.rcvd is not None and closed.rcvd.code == POLICY_VIOLATION
        return
    while first["type"] not in ("completion", "error"):  # a valid config: it runs to its end
        first = json.loads(ws.recv())


ROUTES: dict[str, Callable[[Connection], None]] = {
    "/ws": _batch_answered,
    "/ws/events": _events_answered,
    "/generate": _control_answered,
}


def _healthy(server: RunningServer) -> None:
    assert web.get(server.http + "/health").status_code == 200


@pytest.mark.parametrize("path", list(ROUTES))
def test_random_frames_get_the_protocols_answer(server: RunningServer, path: str) -> None:
    @FUZZ
    @given(frame=FRAMES)
    def run(frame: Frame) -> None:
        with connect(server.ws + path) as ws:
            ws.send(frame)
            ROUTES[path](ws)

    run()
    _healthy(server)


@pytest.mark.parametrize("path", list(ROUTES))
def test_invalid_utf8_in_a_text_frame_closes_1007(server: RunningServer, path: str) -> None:
    with connect(server.ws + path) as ws:
        ws.send(b'{"prompts": "\xff\xfe\xfd"}', text=True)  # a text frame, unchecked
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv()
    assert closed.value.sent is not None and closed.value.sent.code == INVALID_DATA
    _healthy(server)


@pytest.mark.parametrize("path", list(ROUTES))
def test_invalid_utf8_in_a_binary_frame_is_the_protocols_error(
    server: RunningServer, path: str
) -> None:
    with connect(server.ws + path) as ws:
        ws.send(b'{"prompts": "\xff\xfe\xfd", "data": "\xff", "type": "config"}')
        ROUTES[path](ws)
    _healthy(server)


@pytest.mark.parametrize("path", list(ROUTES))
def test_oversize_messages_close_1009(make_server: Callable[..., RunningServer], path: str) -> None:
    small = make_server(MAX_WS_MESSAGE_BYTES="1024")
    with connect(small.ws + path) as ws:
        ws.send(json.dumps({"prompts": "x" * 2048}))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == TOO_BIG
    _healthy(small)


def _error(ws: Connection) -> dict[str, Any]:
    message: dict[str, Any] = json.loads(ws.recv())
    assert message["type"] == "error", message
    return message


@pytest.mark.parametrize("action", ["stop", "pause", "resume", "modify", "regenerate"])
def test_a_control_before_config_closes_1008(server: RunningServer, action: str) -> None:
    with connect(server.ws + "/generate") as ws:
        ws.send(control(action))
        assert _error(ws)["recoverable"] is False
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == POLICY_VIOLATION


def test_controls_out_of_order_are_errors_and_the_session_goes_on(server: RunningServer) -> None:
    with connect(server.ws + "/generate") as ws:
        ws.send(config("Hi", max_tokens=3, temperature=0))
        while json.loads(ws.recv())["type"] != "completion":
            pass
        for action in ("resume", "pause", "stop", "modify"):  # nothing runs: none applies
            ws.send(control(action))
            assert _error(ws)["recoverable"] is True
        ws.send(json.dumps({"type": "feedback", "rating": 2}))  # out of range
        assert _error(ws)["field"] == "$.rating"
        ws.send(json.dumps({"type": "control", "action": "rewind"}))
        assert _error(ws)["field"] == "$.action"
        ws.send(config("Hi again", max_tokens=3, temperature=0))  # still a working session
        while (message := json.loads(ws.recv()))["type"] not in ("completion", "error"):
            pass
        assert message["type"] == "completion", message
    _healthy(server)


def test_events_with_unknown_ids_and_duplicates(server: RunningServer) -> None:
    start = {"type": "START", "id": "dup", "data": "Hi", "parameters": {"max_new_tokens": 3}}
    with connect(server.ws + "/ws/events") as ws:
        ws.send(json.dumps([{"type": "PROGRESS", "id": "nobody", "data": "x"}]))
        assert json.loads(ws.recv())[0]["type"] == "ERROR"
        ws.send(json.dumps([start, start]))
        [refused] = json.loads(ws.recv())  # one answer for the id, and neither START runs
        assert refused["type"] == "ERROR" and refused["id"] == "dup", refused
    _healthy(server)
