"""Loading, admission, duplicate request_ids, and clients that leave in every phase."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest
from websockets.sync.connection import Connection

from clients import CHAT, UNENDING, connect, frames_until_done, greedy, payload, wait_for, web
from serving import LoopThread, RunningServer, gateway_settings, loading_server, start_server

if TYPE_CHECKING:
    from gateway.engine.vllm_engine import VllmEngine

LONG = greedy(UNENDING, ignore_eos=True)
PROMPT = CHAT.format("Write a very long essay about rivers.")


def recv_until(ws: Connection, kind: str) -> list[dict[str, object]]:
    while True:
        frame = json.loads(ws.recv())
        if any(e["type"] == kind for e in frame):
            return list(frame)


def unfinished(server: RunningServer) -> int:
    engine = server.gateway.service.holder.engine
    assert engine is not None
    return server.loop.call(engine.unfinished_requests)


def test_health_is_503_while_loading_and_requests_wait_for_the_engine(
    loop_thread: LoopThread, engine: VllmEngine
) -> None:
    with loading_server(loop_thread, engine) as (loading, finish_loading):
        for path in ("/health", "/ping"):
            response = web.get(loading.http + path)
            assert response.status_code == 503 and response.json()["status"] == "loading"
        with connect(loading.ws + "/ws") as ws:  # connections are accepted while loading
            ws.send(payload(("early", PROMPT), generation_config=greedy(3)))
            # A marker answered at once: what comes before its answer was sent while loading.
            ws.send("{not json")
            [marker] = json.loads(ws.recv())  # nothing of "early": it waits to be checked
            assert marker["type"] == "ERROR" and "Malformed JSON" in marker["error"]
            finish_loading()
            frames = frames_until_done(ws, {"early"})
        assert frames[0] == [{"type": "ACCEPTED", "request_id": "early"}]
        assert frames[1] == [{"type": "STARTED", "request_id": "early"}]
        assert frames[-1][0]["type"] == "COMPLETE"
        assert web.get(loading.http + "/ping").status_code == 200


def test_an_engine_that_fails_to_start_is_reported(loop_thread: LoopThread) -> None:
    async def broken() -> VllmEngine:
        raise RuntimeError("no such model")

    failed = start_server(loop_thread, gateway_settings(), broken)
    try:
        wait_for(lambda: web.get(failed.http + "/health").json()["status"] != "loading")
        health = web.get(failed.http + "/health")
        assert health.status_code == 503 and "no such model" in health.json()["error"]
        with connect(failed.ws + "/ws") as ws:
            ws.send(payload(("doomed", "hi")))
            frames = frames_until_done(ws, {"doomed"})
        assert frames[-1][0]["type"] == "ERROR" and "no such model" in frames[-1][0]["error"]
    finally:
        failed.stop()


def test_admission_queues_then_refuses_with_rate_limited(
    make_server: Callable[..., RunningServer], idle_engine: Callable[..., None]
) -> None:
    tight = make_server(MAX_RUNNING_REQUESTS="1", MAX_WAITING_REQUESTS="1")
    admission = tight.gateway.service.admission
    with connect(tight.ws + "/ws") as running, connect(tight.ws + "/ws") as queued:
        running.send(payload(("run", PROMPT), generation_config=LONG))
        recv_until(running, "PROGRESS")
        queued.send(payload(("wait", PROMPT), generation_config=LONG))
        assert json.loads(queued.recv())[0]["type"] == "ACCEPTED"
        with connect(tight.ws + "/ws") as refused:
            refused.send(payload(("nope", PROMPT), generation_config=LONG))
            [error] = frames_until_done(refused, {"nope"})[-1]
            assert error["type"] == "ERROR" and "Too many requests" in error["error"]
        rest = web.post(
            tight.http + "/api/generate-one",
            json={"request_id": "nope2", "prompt": "x", "stream_response": False},
        )
        assert rest.status_code == 429 and rest.json()["type"] == "rate_limited"
        assert admission.waiting == 1
        queued.close()  # a client that leaves while queued frees its place
        wait_for(lambda: admission.waiting == 0)
        assert unfinished(tight) == 1
    idle_engine()
    assert admission.running == 0


def test_a_request_id_in_flight_cannot_be_used_twice(
    server: RunningServer, idle_engine: Callable[..., None]
) -> None:
    with connect(server.ws + "/ws") as ws:
        ws.send(payload(("twin", PROMPT), generation_config=LONG))
        recv_until(ws, "PROGRESS")
        ws.send(payload(("twin", PROMPT), generation_config=greedy(2)))
        frame = recv_until(ws, "ERROR")
        assert "already generating" in str(frame[0]["error"])
        rest = web.post(
            server.http + "/api/generate-one",
            json={"request_id": "twin", "prompt": "x", "stream_response": False},
        )
        assert rest.status_code == 409 and rest.json()["type"] == "duplicate_request_id"
        ws.send(payload(("same", "a"), ("same", "b"), generation_config=greedy(2)))
        frames = frames_until_done(ws, {"same"})
        assert any(e["type"] == "ERROR" and e["request_id"] == "same" for f in frames for e in f)
    idle_engine()


@pytest.mark.parametrize("phase", ["prefill", "decode", "several payloads"])
def test_a_websocket_client_that_leaves_stops_its_generations(
    server: RunningServer, idle_engine: Callable[..., None], phase: str
) -> None:
    # About 1,000 fresh tokens: a prefill of a second or two on this machine.
    long_prompt = CHAT.format(f"{uuid.uuid4()} " + "the tide comes in and goes out. " * 120)
    with connect(server.ws + "/ws") as ws:
        if phase == "prefill":
            ws.send(payload(("pre", long_prompt), generation_config=LONG))
            frame = recv_until(ws, "STARTED")
            assert unfinished(server) == 1
            assert all(e["type"] != "INITIALIZED" for e in frame)
        elif phase == "decode":
            ws.send(payload(("dec", PROMPT), generation_config=LONG))
            recv_until(ws, "PROGRESS")
            assert unfinished(server) == 1
        else:
            ws.send(payload(("m1", PROMPT), ("m2", PROMPT), generation_config=LONG))
            ws.send(payload(("m3", PROMPT), generation_config=LONG))
            recv_until(ws, "PROGRESS")
    idle_engine()


def test_a_request_id_is_free_again_once_its_client_left_or_its_prompt_ended(
    server: RunningServer, idle_engine: Callable[..., None]
) -> None:
    with web.stream(
        "POST",
        server.http + "/api/generate-one",
        json={"request_id": "again", "prompt": PROMPT, "generation_config": LONG},
    ) as r:
        next(r.iter_text())
    idle_engine()
    retry = web.post(
        server.http + "/api/generate-one",
        json={
            "request_id": "again",
            "prompt": PROMPT,
            "stream_response": False,
            "generation_config": greedy(2),
        },
    )
    assert retry.status_code == 200

    quick_prompt = CHAT.format("What is 2+2?")
    with connect(server.ws + "/ws") as ws:
        ws.send(payload(("slow", PROMPT), ("quick", quick_prompt), generation_config=greedy(300)))
        assert json.loads(ws.recv())[0]["type"] == "ACCEPTED"  # both are generating now
        service = server.gateway.service
        wait_for(lambda: not server.loop.call(lambda: service.is_generating("quick")))
        assert unfinished(server) == 1  # "slow" is still generating
        # "quick" ended: its id is free while its payload's other prompt still runs
        with connect(server.ws + "/ws") as other:
            other.send(payload(("quick", "x"), generation_config=greedy(2, ignore_eos=True)))
            assert frames_until_done(other, {"quick"})[-1][0]["type"] == "COMPLETE"
    idle_engine()


def test_failed_requests_do_not_evict_stored_histories(
    make_server: Callable[..., RunningServer],
) -> None:
    one_entry = make_server(CONTINUATION_MAX_ENTRIES="1")
    cfg = greedy(3, ignore_eos=True)
    url = one_entry.http + "/api/generate-batch"
    kept = web.post(
        url,
        json={"prompts": [{"request_id": "kept", "prompt": PROMPT}], "generation_config": cfg},
    )
    assert kept.status_code == 200
    too_long = web.post(
        url,
        json={
            "prompts": [{"request_id": "huge", "prompt": "word " * 3000}],
            "generation_config": cfg,
        },
    )
    assert too_long.status_code == 422 or "error" in too_long.json()[0]
    again = web.post(
        url,
        json={
            "prompts": [{"request_id": "kept", "prompt": "z"}],
            "only_new_tokens": False,
            "generation_config": cfg,
        },
    ).json()
    assert again[0]["prompt"] == PROMPT + kept.json()[0]["response"]
