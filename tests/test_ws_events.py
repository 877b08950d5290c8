"""WS `/ws/events` with a real websockets client against the real engine."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from websockets.sync.connection import Connection

from clients import CHAT, MAX_MODEL_LEN, UNENDING, connect
from protocols.ws_events import Complete, Progress, Start, decode_frame
from serving import RunningServer

PROMPT = CHAT.format("Write a poem about the moon.")
Event = dict[str, Any]


def start(event_id: str, data: str = PROMPT, **parameters: Any) -> Event:
    event: Event = {"type": "START", "id": event_id, "data": data}
    if parameters:
        event["parameters"] = parameters
    return event


def frames_until_complete(ws: Connection, ids: set[str]) -> list[list[Event]]:
    frames: list[list[Event]] = []
    waiting = set(ids)
    while waiting:
        frame = json.loads(ws.recv())
        assert isinstance(frame, list) and frame
        frames.append(frame)
        waiting -= {e["id"] for e in frame if e["type"] in ("COMPLETE", "ERROR")}
    return frames


def test_start_progress_complete(server: RunningServer) -> None:
    with connect(server.ws + "/ws/events") as ws:
        ws.send(json.dumps([start("123", max_new_tokens=10, do_sample=False, ignore_eos=True)]))
        frames = frames_until_complete(ws, {"123"})
    assert frames[0] == [{"type": "START", "id": "123", "data": PROMPT}]
    assert all(len(f) == 1 for f in frames)
    progress = [f[0] for f in frames[1:-1]]
    assert progress and all(e["type"] == "PROGRESS" and e["id"] == "123" for e in progress)
    complete = frames[-1][0]
    assert complete == {
        "type": "COMPLETE",
        "id": "123",
        "data": "".join(e["data"] for e in progress),
        "isEos": False,
    }
    decoded = [decode_frame(json.dumps(f)) for f in frames]
    assert isinstance(decoded[0][0], Start) and isinstance(decoded[1][0], Progress)
    assert isinstance(decoded[-1][0], Complete) and decoded[-1][0].is_eos is False


def test_a_bare_start_object_and_is_eos(server: RunningServer) -> None:
    with connect(server.ws + "/ws/events") as ws:
        ws.send(
            json.dumps(
                start("eos", CHAT.format("What is 2+2?"), max_new_tokens=100, do_sample=False)
            )
        )
        complete = frames_until_complete(ws, {"eos"})[-1][0]
    assert complete["type"] == "COMPLETE" and complete["isEos"] is True


def test_several_starts_run_concurrently(server: RunningServer) -> None:
    with connect(server.ws + "/ws/events") as ws:
        ws.send(json.dumps([start("long", max_new_tokens=40, ignore_eos=True)]))
        ws.send(
            json.dumps(
                [
                    start("short", max_new_tokens=3, ignore_eos=True),
                    start("short2", max_new_tokens=3, ignore_eos=True),
                ]
            )
        )
        frames = frames_until_complete(ws, {"long", "short", "short2"})
    assert [e["id"] for e in frames[1]] == ["short", "short2"]  # the echo of the second frame
    done = [e["id"] for f in frames for e in f if e["type"] == "COMPLETE"]
    assert done.index("short") < done.index("long") and done.index("short2") < done.index("long")


def test_bad_events_get_an_error_event_and_the_connection_stays_usable(
    server: RunningServer,
) -> None:
    with connect(server.ws + "/ws/events") as ws:
        ws.send("not json")
        [error] = json.loads(ws.recv())
        assert error["type"] == "ERROR" and error["id"] is None and error["field"] == "$"
        ws.send(
            json.dumps(
                [
                    start("ok", max_new_tokens=2),
                    {"type": "START", "id": "nodata"},
                    start("bad", max_new_tokens=0),
                    {"type": "STOP", "id": "x"},
                ]
            )
        )
        frames = frames_until_complete(ws, {"ok"})
        assert frames[0] == [{"type": "START", "id": "ok", "data": PROMPT}]
        errors = frames[1]
        assert [(e["id"], e["field"]) for e in errors] == [
            ("nodata", "$[1].data"),
            ("bad", "$[2].parameters.max_new_tokens"),
            ("x", "$[3].type"),
        ]
        ws.send(json.dumps([start("again", max_new_tokens=2)]))
        assert frames_until_complete(ws, {"again"})[-1][0]["type"] == "COMPLETE"


def test_a_refused_start_gets_its_error_and_no_echo(
    server: RunningServer, idle_engine: Callable[..., None]
) -> None:
    with connect(server.ws + "/ws/events") as busy, connect(server.ws + "/ws/events") as ws:
        busy.send(json.dumps([start("busy", max_new_tokens=UNENDING, ignore_eos=True)]))
        assert json.loads(busy.recv())[0]["id"] == "busy"  # echoed: it is running
        ws.send(
            json.dumps(
                [
                    start("fine", max_new_tokens=2),
                    start("empty", ""),
                    start("long", "word " * MAX_MODEL_LEN),
                    start("busy", max_new_tokens=2),
                    start("dup", max_new_tokens=2),
                    start("dup", max_new_tokens=2),
                ]
            )
        )
        echo, errors, *rest = frames_until_complete(ws, {"fine", "empty", "long", "busy", "dup"})
    idle_engine()
    assert echo == [{"type": "START", "id": "fine", "data": PROMPT}]
    assert [(e["type"], e["id"], e["field"]) for e in errors] == [
        ("ERROR", "empty", "$[1].data"),
        ("ERROR", "long", "$[2].data"),
        ("ERROR", "busy", "$[3].id"),
        ("ERROR", "dup", "$[4].id"),
    ]
    assert "continu" not in errors[0]["data"] and "`data` is empty" in errors[0]["data"]
    assert "already generating" in errors[2]["data"] and "events:" not in errors[2]["data"]
    assert "more than once" in errors[3]["data"]
    assert {e["id"] for frame in rest for e in frame} == {"fine"}
    assert rest[-1][0]["type"] == "COMPLETE"


def test_generation_config_fields_vllm_lacks_are_accepted(server: RunningServer) -> None:
    with connect(server.ws + "/ws/events") as ws:
        ws.send(json.dumps([start("hf", max_new_tokens=2, typical_p=0.5, max_length=None)]))
        frames = frames_until_complete(ws, {"hf"})
        ws.send(json.dumps([start("typo", max_new_tokens=2, typical_q=0.5)]))
        [error] = frames_until_complete(ws, {"typo"})[-1]
    assert frames[0][0]["type"] == "START" and frames[-1][0]["type"] == "COMPLETE"
    assert error["field"] == "$[0].parameters.typical_q"


def test_an_id_is_not_a_continuation_key(server: RunningServer) -> None:
    with connect(server.ws + "/ws/events") as ws:
        config: dict[str, Any] = {"max_new_tokens": 4, "do_sample": False, "ignore_eos": True}
        ws.send(json.dumps([start("same", **config)]))
        first = frames_until_complete(ws, {"same"})[-1][0]["data"]
        ws.send(json.dumps([start("same", **config)]))
        second = frames_until_complete(ws, {"same"})[-1][0]["data"]
    assert first == second  # the same prompt afresh, not a continuation


def test_a_client_that_leaves_stops_its_generations(
    server: RunningServer, idle_engine: Callable[..., None]
) -> None:
    with connect(server.ws + "/ws/events") as ws:
        ws.send(
            json.dumps(
                [
                    start("a", max_new_tokens=UNENDING, ignore_eos=True),
                    start("b", max_new_tokens=UNENDING, ignore_eos=True),
                ]
            )
        )
        frames_seen = 0
        while frames_seen < 4:
            json.loads(ws.recv())
            frames_seen += 1
        engine = server.gateway.service.holder.engine
        assert engine is not None and server.loop.call(engine.unfinished_requests) == 2
    idle_engine()
