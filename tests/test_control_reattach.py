"""REATTACH_SECONDS: a control-protocol client whose connection drops takes its generation back
(docs/CONTROL.md, "Reattaching")."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import pytest
from control_client import Message, config, control, receive, tokens_of, until
from websockets.exceptions import ConnectionClosed
from websockets.sync.connection import Connection

from clients import CHAT, UNENDING, connect, wait_for
from serving import RunningServer

STORY = CHAT.format("Write a long, detailed story about a dragon and a village.")
ALICE, BOB = "sk-alice-secret", "sk-bob-secret"
KEYS = f"{ALICE}:alice,{BOB}:bob"
REATTACH_LOG = "gateway.engine_path.reattach"


def reattach(request_id: str, received: int | None = None) -> str:
    body: Message = {"type": "reattach", "request_id": request_id}
    if received is not None:
        body["received"] = received
    return json.dumps(body)


def control_ws(server: RunningServer, key: str | None = None) -> Connection:
    return connect(server.ws + "/generate", subprotocols=[f"bearer.{key}"] if key else None)


def waiting(server: RunningServer) -> int:
    """Generations waiting for their client to reattach."""
    return server.loop.call(lambda: len(server.gateway.detached))


def running(server: RunningServer) -> int:
    """Requests holding an engine slot (gateway_running_requests), and the engine's own."""
    engine = server.gateway.service.holder.engine
    assert engine is not None
    return server.loop.call(
        lambda: server.gateway.service.admission.running + engine.unfinished_requests()
    )


def started(ws: Connection, tokens: int, **parameters: Any) -> tuple[str, list[Message]]:
    """A greedy generation started, and its first `tokens` token messages."""
    ws.send(config(STORY, temperature=0, ignore_eos=True, **parameters))
    init = until(ws, "init")[-1]
    return init["request_id"], [until(ws, "token")[-1] for _ in range(tokens)]


def test_a_dropped_client_reattaches_and_gets_every_token_once(
    make_server: Callable[..., RunningServer],
) -> None:
    server = make_server(REATTACH_SECONDS="600", API_KEYS=KEYS)
    with control_ws(server, ALICE) as first:
        request_id, before = started(first, 3, max_tokens=48)
    wait_for(lambda: waiting(server) == 1)  # the server saw the drop; the generation runs on

    with control_ws(server, BOB) as other:
        other.send(reattach(request_id))
        refused = receive(other)
    assert refused["type"] == "error" and refused["error"] == "invalid_request"
    assert refused["field"] == "$.request_id" and refused["recoverable"] is True

    with control_ws(server, ALICE) as again:
        again.send(reattach("gen_000000000000"))
        unknown = receive(again)
        assert unknown["type"] == "error" and unknown["field"] == "$.request_id"
        again.send(reattach(request_id, received=10_000))
        too_many = receive(again)
        assert too_many["type"] == "error" and too_many["field"] == "$.received"

        again.send(reattach(request_id, received=len(before)))
        ack = receive(again)
        assert ack["type"] == "status" and ack["operation"] == "reattached"
        with control_ws(server, ALICE) as second:  # one connection holds it at a time
            second.send(reattach(request_id))
            taken = receive(second)
        assert taken["type"] == "error" and taken["field"] == "$.request_id"
        after = until(again, "completion", "error")

    completion = after[-1]
    assert completion["type"] == "completion" and completion["request_id"] == request_id
    texts = [m["token"] for m in before + tokens_of(after)]
    assert "".join(texts) == completion["generated_text"]
    assert completion["usage"]["completion_tokens"] == 48
    assert tokens_of(after)[-1]["finished"] is True
    assert [m["generated_text"] for m in tokens_of(after)][-1] == completion["generated_text"]
    wait_for(lambda: waiting(server) == 0 and running(server) == 0)


@pytest.mark.long  # reattaching in make test: a dropped client's, after the tokens it had
def test_reattaching_from_the_start_replays_every_token_message(
    make_server: Callable[..., RunningServer],
) -> None:
    server = make_server(REATTACH_SECONDS="600")
    with control_ws(server) as first:
        request_id, before = started(first, 2, max_tokens=24)
    wait_for(lambda: waiting(server) == 1)
    with control_ws(server) as again:
        again.send(reattach(request_id))  # `received` left out: everything from the start
        after = until(again, "completion", "error")
    assert after[0]["operation"] == "reattached"
    replayed = tokens_of(after)
    assert replayed[: len(before)] == before  # as they were sent, generated_text included
    assert "".join(m["token"] for m in replayed) == after[-1]["generated_text"]


def test_the_grace_period_ending_stops_the_generation_in_the_engine(
    make_server: Callable[..., RunningServer], caplog: pytest.LogCaptureFixture
) -> None:
    """A client that never comes back: its generation waited, detached, and the grace period's
    end stopped it. That it waited is read from the gateway's log line, which stays, not from
    the waiting count, which the grace period may empty before a slow machine looks (that it
    runs on while detached: the tests with REATTACH_SECONDS=600)."""
    caplog.set_level(logging.INFO, logger=REATTACH_LOG)
    server = make_server(REATTACH_SECONDS="3")
    with control_ws(server) as first:
        request_id, _ = started(first, 2, max_tokens=UNENDING)

    def expired() -> bool:
        lines = [r.getMessage() for r in caplog.records if r.name == REATTACH_LOG]
        return f"{request_id}: no client came back within REATTACH_SECONDS; stopped" in lines

    wait_for(expired)
    wait_for(lambda: waiting(server) == 0 and running(server) == 0)
    with control_ws(server) as late:
        late.send(reattach(request_id))
        refused = receive(late)
    assert refused["type"] == "error" and refused["field"] == "$.request_id"


def test_without_reattach_seconds_a_drop_stops_the_generation_as_the_spec_says(
    server: RunningServer,
) -> None:
    assert server.gateway.settings.reattach_seconds == 0
    with control_ws(server) as first:
        request_id, _ = started(first, 2, max_tokens=UNENDING)
    wait_for(lambda: running(server) == 0)
    assert waiting(server) == 0
    with control_ws(server) as late:
        late.send(reattach(request_id))
        refused = receive(late)
        assert refused["type"] == "error" and refused["field"] == "$.type"
        assert refused["recoverable"] is False  # a first message that is not a config
        with pytest.raises(ConnectionClosed) as closed:
            late.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


def test_a_draining_gateway_stops_detached_generations_at_once(
    make_server: Callable[..., RunningServer],
) -> None:
    """No client could come back (new WebSockets are refused while draining), so a detached
    generation does not hold the drain open for DRAIN_SECONDS."""
    server = make_server(REATTACH_SECONDS="600", DRAIN_SECONDS="600")
    with control_ws(server) as first:
        started(first, 2, max_tokens=UNENDING)
    wait_for(lambda: waiting(server) == 1)
    server.drain()
    wait_for(server.stopped)
    assert waiting(server) == 0 and running(server) == 0


def test_a_generation_that_ended_while_detached_is_replayed_with_its_completion(
    make_server: Callable[..., RunningServer],
) -> None:
    server = make_server(REATTACH_SECONDS="600")
    with control_ws(server) as first:
        request_id, before = started(first, 1, max_tokens=12)
    wait_for(lambda: waiting(server) == 1 and running(server) == 0)  # it ended, detached
    with control_ws(server) as again:
        again.send(reattach(request_id, received=len(before)))
        after = until(again, "completion", "error")
        assert waiting(server) == 0
        again.send(config(STORY, max_tokens=2))  # the connection is its own again
        assert until(again, "completion", "error")[-1]["type"] == "completion"
    assert after[0]["type"] == "status" and after[0]["operation"] == "reattached"
    completion = after[-1]
    assert completion["type"] == "completion" and completion["request_id"] == request_id
    assert completion["usage"]["completion_tokens"] == 12
    texts = [m["token"] for m in before + tokens_of(after)]
    assert "".join(texts) == completion["generated_text"]
    assert tokens_of(after)[-1]["finished"] is True


def test_a_reattached_generation_detaches_again_and_a_busy_connection_is_refused(
    make_server: Callable[..., RunningServer],
) -> None:
    server = make_server(REATTACH_SECONDS="600")
    with control_ws(server) as first:
        request_id, before = started(first, 1, max_tokens=UNENDING)
    wait_for(lambda: waiting(server) == 1)
    assert running(server) > 0  # it runs on, detached
    with control_ws(server) as second:
        second.send(reattach(request_id, received=len(before)))
        assert receive(second)["operation"] == "reattached"
        until(second, "token")  # it runs on, here
    wait_for(lambda: waiting(server) == 1)  # dropped again: it waits again

    with control_ws(server) as third:
        own, _ = started(third, 1, max_tokens=UNENDING)
        third.send(reattach(request_id))
        busy = until(third, "error")[-1]
        assert busy["field"] == "$.type" and busy["recoverable"] is True
        assert busy["request_id"] == own and waiting(server) == 1
        third.send(control("stop"))
        assert until(third, "completion")[-1]["request_id"] == own

        third.send(reattach(request_id))  # its own ended: it may take the other over
        assert until(third, "status")[-1]["operation"] == "reattached"
        third.send(control("stop"))
        stopped = until(third, "completion")[-1]
    assert stopped["request_id"] == request_id and stopped["finish_reason"] == "cancelled"
    wait_for(lambda: waiting(server) == 0 and running(server) == 0)


def test_a_gateway_stopped_without_the_drain_stops_detached_generations(
    make_server: Callable[..., RunningServer], engine_requests: Callable[[], int]
) -> None:
    """The detached generation would otherwise run on, for nobody, on an engine that
    outlives the app (a shared one, or the replicas')."""
    server = make_server(REATTACH_SECONDS="600")
    with control_ws(server) as first:
        started(first, 1, max_tokens=UNENDING)
    wait_for(lambda: waiting(server) == 1)
    server.stop()
    wait_for(lambda: engine_requests() == 0)
