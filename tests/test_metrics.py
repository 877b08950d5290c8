"""GET /metrics: Prometheus figures that move with real traffic, scraped under load."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

from control_client import config, until

from clients import (
    CHAT,
    UNENDING,
    Samples,
    connect,
    frames_until_done,
    greedy,
    payload,
    settled_metrics,
    value,
)
from clients import scrape as scrape_url
from serving import RunningServer

PROMPT = CHAT.format("Describe a forest.")


def scrape(server: RunningServer) -> Samples:
    return scrape_url(server.http)


def test_requests_tokens_latencies_and_continuation_are_counted(server: RunningServer) -> None:
    before = scrape(server)
    key = f"m-{uuid.uuid4()}"
    # longer than two KV blocks, so that continuing it finds whole blocks in the cache
    long_prompt = CHAT.format(f"{key} " + "Describe a forest in every season. " * 40)
    with connect(server.ws + "/ws") as ws:
        ws.send(payload((key, long_prompt), generation_config=greedy(6, ignore_eos=True)))
        frames_until_done(ws, {key})
        during = scrape(server)  # the connection is still open
        ws.send(payload((key, "x"), generation_config=greedy(4, ignore_eos=True)))
        frames_until_done(ws, {key})
    with connect(server.ws + "/generate") as ws:
        ws.send(config(PROMPT, max_tokens=5, temperature=0))
        until(ws, "completion")
    after = scrape(server)

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert value(during, "gateway_websocket_connections", protocol="ws") >= 1
    assert grew("gateway_requests_total", protocol="ws", outcome="ok") == 2
    assert grew("gateway_requests_total", protocol="control", outcome="ok") == 1
    assert grew("gateway_generated_tokens_total", protocol="ws") == 10
    assert grew("gateway_generated_tokens_total", protocol="control") == 5
    assert grew("gateway_time_to_first_token_seconds_count", protocol="ws") == 2
    assert grew("gateway_inter_token_seconds_count", protocol="ws") >= 8
    assert grew("gateway_request_seconds_count", protocol="control") == 1
    assert grew("gateway_continuation_total", result="miss") >= 1
    assert grew("gateway_continuation_total", result="hit") >= 1
    assert grew("gateway_prompt_tokens_total", protocol="ws") > 0
    # the continuation's history came from the prefix cache (whole blocks only)
    assert grew("gateway_prompt_tokens_cached_total", protocol="ws") >= 128
    assert value(after, "gateway_active_streams") == 0


def test_a_client_that_leaves_is_counted_as_cancelled(
    server: RunningServer, idle_engine: Callable[..., None]
) -> None:
    before = settled_metrics(server.http)
    with connect(server.ws + "/ws") as ws:
        ws.send(payload(("leaver", PROMPT), generation_config=greedy(UNENDING, ignore_eos=True)))
        while "PROGRESS" not in ws.recv():
            pass
    idle_engine()
    after = settled_metrics(server.http)
    key = ("gateway_requests_total", (("outcome", "cancelled"), ("protocol", "ws")))
    assert after.get(key, 0.0) - before.get(key, 0.0) == 1


def test_scrapable_under_load(server: RunningServer, idle_engine: Callable[..., None]) -> None:
    with connect(server.ws + "/ws") as ws:
        ids = [f"load{i}" for i in range(8)]
        ws.send(payload(*[(r, PROMPT) for r in ids], generation_config=greedy(40, ignore_eos=True)))
        seen = 0
        while seen < 3:
            frame = json.loads(ws.recv())
            seen += frame[0]["type"] == "PROGRESS"
        under_load = scrape(server)
        assert value(under_load, "gateway_active_streams") == 8
        assert value(under_load, "gateway_running_requests") == 8
        assert value(under_load, "gateway_queue_depth") == 0
        frames_until_done(ws, set(ids))
    idle_engine()


def test_every_accepted_prompt_is_counted_out_once_and_the_engine_holds_none_after(
    make_server: Callable[..., RunningServer], idle_engine: Callable[..., None]
) -> None:
    server = make_server()
    with connect(server.ws + "/ws") as ws:
        ws.send(payload(("done", "Hi"), ("bad", ""), generation_config=greedy(2)))
        frames_until_done(ws, {"done", "bad"})
        ws.send(payload(("leaver", PROMPT), generation_config=greedy(UNENDING, ignore_eos=True)))
        while "PROGRESS" not in ws.recv():
            pass
    idle_engine()
    after = settled_metrics(server.http)

    def ended(kind: str) -> float:
        return value(after, "gateway_terminal_events_total", protocol="ws", kind=kind)

    assert value(after, "gateway_prompts_accepted_total", protocol="ws") == 3
    assert (ended("finished"), ended("invalid_request"), ended("client_gone")) == (1, 1, 1)
    assert value(after, "gateway_engine_aborts_total", protocol="ws") == 1
    assert value(after, "gateway_engine_requests") == 0
