"""Controls that act on the engine: stop, pause, resume, modify, regenerate; and feedback."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from control_client import config, control, receive, tokens_of, until

from clients import CHAT, MAX_MODEL_LEN, UNENDING, connect, wait_for, web
from serving import (
    SCRATCH,
    LoopThread,
    RunningServer,
    gateway_settings,
    shared_loader,
    start_server,
)

if TYPE_CHECKING:
    from gateway.engine.vllm_engine import VllmEngine

STORY = CHAT.format("Write a long, detailed story about a dragon and a village.")


def unfinished(server: RunningServer) -> int:
    engine = server.gateway.service.holder.engine
    assert engine is not None
    return server.loop.call(engine.unfinished_requests)


def test_stop_ends_the_engine_request_and_completes_with_what_was_sent(
    server: RunningServer, idle_engine: Callable[..., None]
) -> None:
    with connect(server.ws + "/generate") as ws:
        ws.send(config(STORY, max_tokens=UNENDING, ignore_eos=True, temperature=0))
        sent = until(ws, "token") + until(ws, "token")
        assert unfinished(server) == 1
        ws.send(control("stop"))
        messages = sent + until(ws, "completion")
        completion = messages[-1]
        idle_engine()
        assert completion["finish_reason"] == "cancelled"
        assert completion["generated_text"] == "".join(t["token"] for t in tokens_of(messages))
        usage = completion["usage"]
        assert 2 <= usage["completion_tokens"] < MAX_MODEL_LEN - usage["prompt_tokens"]  # cut
        ws.send(control("stop"))  # nothing left to stop: a recoverable error
        error = receive(ws)
        assert error["type"] == "error" and error["recoverable"] is True


def test_pause_stops_compute_and_resume_continues_without_loss_or_repeat(
    server: RunningServer, idle_engine: Callable[..., None]
) -> None:
    with connect(server.ws + "/generate") as ws:
        ws.send(config(STORY, max_tokens=60, temperature=0))
        before = until(ws, "token") + until(ws, "token") + until(ws, "token")
        ws.send(control("pause"))
        paused = until(ws, "status")
        assert paused[-1]["operation"] == "paused"
        assert paused[-1]["eta_seconds"] >= 0  # from the pace of the tokens so far
        before += paused[:-1]
        idle_engine()  # nothing runs in the engine while paused
        # A marker answered at once: whatever was sent while paused would come before it.
        ws.send(control("pause"))
        marker = receive(ws)
        assert marker["type"] == "error" and marker["error"] == "invalid_request", marker
        assert "pause" in marker["message"] and marker["recoverable"] is True
        ws.send(control("resume"))
        after = until(ws, "completion")
    assert after[0] == {**after[0], "type": "status", "operation": "resumed"}
    completion = after[-1]
    text_before = "".join(t["token"] for t in tokens_of(before))
    text_after = "".join(t["token"] for t in tokens_of(after))
    assert completion["generated_text"] == text_before + text_after
    assert completion["generated_text"].startswith(text_before) and text_after
    assert completion["usage"]["completion_tokens"] == 60
    assert completion["finish_reason"] == "length"


def test_resume_and_modify_when_they_make_no_sense(server: RunningServer) -> None:
    with connect(server.ws + "/generate") as ws:
        ws.send(config(STORY, max_tokens=3, temperature=0))
        until(ws, "completion")
        for message in (control("resume"), control("modify", temperature=0.5), control("pause")):
            ws.send(message)
            error = receive(ws)
            assert error["type"] == "error" and error["error"] == "invalid_request"
            assert error["recoverable"] is True
        ws.send(config(STORY, max_tokens=2, temperature=0))  # a new config after a completion
        assert until(ws, "completion")[-1]["usage"]["completion_tokens"] == 2


def test_modify_changes_the_rest_of_the_generation(server: RunningServer) -> None:
    with connect(server.ws + "/generate") as ws:
        ws.send(config(STORY, max_tokens=400, temperature=0))
        before = until(ws, "token") + until(ws, "token")
        ws.send(control("modify", max_tokens=12, temperature=0.8, top_p=0.9))
        after = until(ws, "completion")
    assert any(m["type"] == "status" and m["operation"] == "modified" for m in after)
    completion = after[-1]
    text_before = "".join(t["token"] for t in tokens_of(before))
    assert completion["generated_text"].startswith(text_before)
    assert completion["usage"]["completion_tokens"] == 12  # the new max_tokens took effect
    assert completion["finish_reason"] == "length"


def test_modify_while_paused_applies_on_resume(server: RunningServer) -> None:
    with connect(server.ws + "/generate") as ws:
        ws.send(config(STORY, max_tokens=400, temperature=0))
        until(ws, "token")
        ws.send(control("pause"))
        until(ws, "status")
        ws.send(control("modify", max_tokens=8))
        assert until(ws, "status")[-1]["operation"] == "modified"
        ws.send(control("resume"))
        assert until(ws, "completion")[-1]["usage"]["completion_tokens"] == 8


@pytest.mark.long  # 200 tokens twice; regenerate in `make test`: test_control_stops.py
def test_regenerate_restarts_under_a_new_request_id(server: RunningServer) -> None:
    with connect(server.ws + "/generate") as ws:
        ws.send(config(STORY, max_tokens=200, temperature=0))
        first = until(ws, "init")[-1]
        until(ws, "token")
        ws.send(control("regenerate"))
        abandoned = until(ws, "completion")[-1]
        messages = until(ws, "completion")
    assert abandoned["request_id"] == first["request_id"]
    assert abandoned["finish_reason"] == "cancelled"
    inits = [m for m in messages if m["type"] == "init"]
    assert len(inits) == 1 and inits[0]["request_id"] != first["request_id"]
    after_init = messages[messages.index(inits[0]) + 1 :]
    completion = after_init[-1]
    assert completion["request_id"] == inits[0]["request_id"]
    assert completion["generated_text"] == "".join(t["token"] for t in tokens_of(after_init))
    assert completion["usage"]["completion_tokens"] == 200


@pytest.mark.parametrize("phase", ["queued", "prefill", "decode", "paused"])
def test_a_client_that_leaves_stops_its_generation(
    make_server: Callable[..., RunningServer], idle_engine: Callable[..., None], phase: str
) -> None:
    gateway = make_server(MAX_RUNNING_REQUESTS="1")
    admission = gateway.gateway.service.admission
    long_prompt = CHAT.format(f"{uuid.uuid4()} " + "the river runs to the sea. " * 150)
    with connect(gateway.ws + "/generate") as holder_ws:
        if phase == "queued":
            holder_ws.send(config(STORY, max_tokens=UNENDING, ignore_eos=True, temperature=0))
            until(holder_ws, "token")
        with connect(gateway.ws + "/generate") as ws:
            prompt = long_prompt if phase == "prefill" else STORY
            ws.send(config(prompt, max_tokens=UNENDING, ignore_eos=True))
            until(ws, "init")
            if phase == "queued":
                assert admission.waiting == 1
            elif phase == "prefill":
                assert unfinished(gateway) == 1
            else:
                until(ws, "token")
                if phase == "paused":
                    ws.send(control("pause"))
                    until(ws, "status")
        if phase == "queued":
            wait_for(lambda: admission.waiting == 0)
    idle_engine()
    assert admission.running == 0


def test_feedback_is_stored_and_survives_a_restart(
    loop_thread: LoopThread, engine: VllmEngine
) -> None:
    db = SCRATCH / f"feedback-{uuid.uuid4().hex}.sqlite3"
    first = start_server(loop_thread, gateway_settings(FEEDBACK_DB=str(db)), shared_loader(engine))
    try:
        with connect(first.ws + "/generate") as ws:
            ws.send(json.dumps({"type": "feedback", "rating": 1}))  # not a config first
            assert receive(ws)["recoverable"] is False
        with connect(first.ws + "/generate") as ws:
            ws.send(config(STORY, max_tokens=2, temperature=0))
            request_id = until(ws, "completion")[-1]["request_id"]
            ws.send(json.dumps({"type": "feedback", "rating": 2}))
            error = receive(ws)
            assert error["error"] == "invalid_request" and error["field"] == "$.rating"
            ws.send(
                json.dumps({"type": "feedback", "rating": -0.5, "text": "too short", "position": 1})
            )
            assert receive(ws)["operation"] == "feedback_recorded"
    finally:
        first.stop()
    second = start_server(loop_thread, gateway_settings(FEEDBACK_DB=str(db)), shared_loader(engine))
    try:
        with connect(second.ws + "/generate") as ws:
            ws.send(config(STORY, max_tokens=2, temperature=0))
            until(ws, "completion")
            ws.send(json.dumps({"type": "feedback", "rating": 1}))
            assert receive(ws)["operation"] == "feedback_recorded"
    finally:
        second.stop()
    cli = Path(sys.executable).with_name("llm-gateway")
    done = subprocess.run(
        [str(cli), "export-feedback", "--db", str(db)],
        capture_output=True,
        text=True,
        check=True,
    )
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["rating"], r["text"], r["position"]) for r in records] == [
        (-0.5, "too short", 1),
        (1.0, None, None),
    ]
    assert records[0]["request_id"] == request_id
    assert all(r["model"] == "SmolLM2-135M-Instruct" and r["created_at"] > 0 for r in records)


def test_status_while_loading_then_init(loop_thread: LoopThread, engine: VllmEngine) -> None:
    gate = asyncio.Event()

    async def open_gate() -> None:
        await gate.wait()

    loading = start_server(loop_thread, gateway_settings(), shared_loader(engine, open_gate))
    try:
        with connect(loading.ws + "/generate") as ws:
            status = receive(ws)
            assert status["type"] == "status" and status["operation"] == "model_loading"
            assert 0 <= status["progress"] < 100 and status["eta_seconds"] > 0
            assert status["message"]
            ws.send(config(STORY, max_tokens=3, temperature=0))
            assert receive(ws)["type"] == "status"  # still loading, still told
            loop_thread.call(gate.set)
            messages = until(ws, "completion")
        kinds = [m["type"] for m in messages]
        assert "init" in kinds and kinds.index("init") < kinds.index("completion")
        assert set(kinds[: kinds.index("init")]) <= {"status"}
    finally:
        loading.stop()


def test_rest_generate_json_and_sse(server: RunningServer) -> None:
    body = {"prompt": STORY, "max_tokens": 7, "temperature": 0}
    answer = web.post(server.http + "/v1/generate", json=body)
    assert answer.status_code == 200
    result = answer.json()
    assert result["id"].startswith("gen_") and result["model"] == "SmolLM2-135M-Instruct"
    assert result["usage"]["completion_tokens"] == 7 and result["finish_reason"] == "length"

    events = []
    with web.stream(
        "POST", server.http + "/v1/generate", json={**body, "stream": True}
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: ") :]))
    kinds = [e["type"] for e in events]
    assert kinds[0] == "init" and kinds[-1] == "completion" and "token" in kinds
    assert events[-1]["generated_text"] == result["generated_text"]

    bad = web.post(server.http + "/v1/generate", json={"prompt": "x", "top_k": "many"})
    assert bad.status_code == 422 and bad.json()["field"] == "$.top_k"
    nested = {"type": "config", "prompt": STORY, "parameters": {"max_tokens": 3, "temperature": 0}}
    answer = web.post(server.http + "/v1/generate", json=nested)
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 3
    assert (
        answer.json()["generated_text"]
        == result["generated_text"][: len(answer.json()["generated_text"])]
    )
    too_long = web.post(server.http + "/v1/generate", json={"prompt": "word " * 3000})
    assert too_long.status_code == 422
    assert too_long.json()["error"] == "context_length_exceeded"


def test_a_pause_that_lasts_too_long_ends_with_a_timeout(
    make_server: Callable[..., RunningServer],
) -> None:
    impatient = make_server(PAUSE_TIMEOUT_SECONDS="0.5")
    with connect(impatient.ws + "/generate") as ws:
        ws.send(config(STORY, max_tokens=300, temperature=0))
        request_id = until(ws, "init")[-1]["request_id"]
        until(ws, "token")
        ws.send(control("pause"))
        until(ws, "status")
        error = receive(ws)  # once the pause timeout has passed on the server
        assert error["type"] == "error" and error["error"] == "timeout"
        assert error["recoverable"] is True and error["recovery_action"] == "regenerate"
        assert error["request_id"] == request_id
        ws.send(control("resume"))
        assert receive(ws)["error"] == "invalid_request"
        ws.send(control("regenerate"))
        assert until(ws, "init")[-1]["request_id"] != request_id
