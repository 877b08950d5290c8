"""Gateways on one real redis-server (REDIS_URL): a restart continues every request_id, two
gateways never run one id at once, and Redis down fails only what needs it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from redis_server import RedisServer, running_redis

from clients import CHAT, UNENDING, connect, events_of, greedy, payload, run_ws, wait_for, web
from gateway.stores.redis_store import running_key
from serving import RunningServer

MakeServer = Callable[..., RunningServer]


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with running_redis() as server:
        yield server


def batch(server: RunningServer, prompts: list[tuple[str, str]], **fields: Any) -> httpx.Response:
    body = {"prompts": [{"request_id": r, "prompt": p} for r, p in prompts], **fields}
    return web.post(server.http + "/api/generate-batch", json=body)


def test_a_restarted_gateway_continues_every_request_id(
    make_server: MakeServer, redis_server: RedisServer
) -> None:
    a, b = f"a-{uuid.uuid4()}", f"b-{uuid.uuid4()}"
    pa, pb = CHAT.format("Name a color."), CHAT.format("Name a fruit.")
    cfg = greedy(6, ignore_eos=True)
    first = make_server(REDIS_URL=redis_server.url)
    answers = batch(first, [(a, pa), (b, pb)], generation_config=cfg).json()
    [alone] = batch(first, [(a, pa)], generation_config=cfg).json()
    first.stop()  # every history it had is in Redis, none in a process

    second = make_server(REDIS_URL=redis_server.url)
    again = batch(
        second, [(a, "ignored"), (b, "ignored")], only_new_tokens=False, generation_config=cfg
    )
    assert again.status_code == 200, again.text
    assert [r["prompt"] for r in again.json()] == [
        pa + answers[0]["response"],
        pb + answers[1]["response"],
    ]
    frames = run_ws(
        second.ws, payload((a, "ignored"), only_new_tokens=False, generation_config=greedy(3)), {a}
    )
    initialized = next(e for e in events_of(frames, a) if e["type"] == "INITIALIZED")
    assert initialized["text"] == pa + alone["response"]  # the single id is its own key


def test_two_gateways_never_run_one_request_id_at_once(
    make_server: MakeServer, redis_server: RedisServer, idle_engine: Callable[[], None]
) -> None:
    first = make_server(REDIS_URL=redis_server.url)
    second = make_server(REDIS_URL=redis_server.url)
    rid = f"busy-{uuid.uuid4()}"
    forever = greedy(UNENDING, ignore_eos=True)
    with connect(first.ws + "/ws") as ws:
        ws.send(payload((rid, CHAT.format("Write a long essay.")), generation_config=forever))
        wait_for(lambda: redis_server.client.exists(running_key("", rid)))
        refused = batch(second, [(rid, "hi")], generation_config=greedy(2))
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"] == f"request_id {rid!r} is already generating; " + (
            "wait for its end or use another id"
        )
        frames = run_ws(second.ws, payload((rid, "hi"), generation_config=greedy(2)), {rid})
        assert events_of(frames, rid)[-1]["type"] == "ERROR"
    # Closing the socket aborts the payload, which frees its request_id everywhere.
    wait_for(lambda: not redis_server.client.exists(running_key("", rid)))
    idle_engine()
    assert batch(second, [(rid, "hi")], generation_config=greedy(2)).status_code == 200


def test_redis_down_fails_what_needs_it_and_nothing_else(
    make_server: MakeServer, redis_server: RedisServer
) -> None:
    server = make_server(REDIS_URL=redis_server.url)
    rid = f"down-{uuid.uuid4()}"
    named = f"The continuation store (Redis at {redis_server.url}) cannot be reached"
    redis_server.stop()

    health = web.get(server.http + "/health")
    assert health.status_code == 200
    assert health.json()["status"] == "degraded" and named in health.json()["error"]

    refused = batch(server, [(rid, "hi")], generation_config=greedy(2))
    assert refused.status_code == 503 and refused.json()["error"].startswith(named)
    one = web.post(
        server.http + "/api/generate-one",
        json={"request_id": rid, "prompt": "hi", "generation_config": greedy(2)},
    )
    assert one.status_code == 503 and one.json()["error"].startswith(named)
    frames = run_ws(server.ws, payload((rid, "hi"), generation_config=greedy(2)), {rid})
    [error] = [e for e in events_of(frames, rid) if e["type"] == "ERROR"]
    assert error["error"].startswith(named)

    # What keeps no history goes on: OpenAI, TGI.
    completion = web.post(
        server.http + "/v1/completions",
        json={"prompt": "Hello", "max_tokens": 3, "temperature": 0},
    )
    assert completion.status_code == 200, completion.text
    tgi = web.post(
        server.http + "/generate",
        json={"inputs": "Hello", "parameters": {"max_new_tokens": 3}},
    )
    assert tgi.status_code == 200 and json.loads(tgi.text)["generated_text"]
    # The Responses API: `store: false` keeps nothing and is served; `store: true` (OpenAI's
    # default) is refused before any engine work, naming the store and the field.
    unstored = web.post(
        server.http + "/v1/responses",
        json={"input": "Hello", "max_output_tokens": 3, "temperature": 0, "store": False},
    )
    assert unstored.status_code == 200, unstored.text
    assert unstored.json()["output"][0]["content"][0]["text"], unstored.text
    stored = web.post(
        server.http + "/v1/responses", json={"input": "Hello", "max_output_tokens": 3}
    )
    assert stored.status_code == 503, stored.text
    assert stored.json()["error"]["param"] == "store"
    assert stored.json()["error"]["message"].startswith(named)

    redis_server.start()  # back, empty: the same request_id starts afresh
    assert web.get(server.http + "/health").json() == {"status": "ready"}
    again = batch(server, [(rid, "hi")], generation_config=greedy(2))
    assert again.status_code == 200, again.text
