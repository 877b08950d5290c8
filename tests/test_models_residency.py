"""Several chat models in one gateway (MODELS_FILE), loaded on demand within MAX_LOADED_MODELS
(docs/MODELS.md): real engines, each model's own, the default one the session's.

The models are the shipped SmolLM2 under other names (their answers are SmolLM2's): what is
told apart here is which engine is loaded, through /v1/models' `state` and /metrics."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from clients import connect, events_of, frames_until_done, payload, scrape, value, wait_for, web
from serving import (
    SCRATCH,
    LoopThread,
    RunningServer,
    gateway_settings,
    shared_loader,
    start_server,
)

pytestmark = [pytest.mark.engine, pytest.mark.own_engine]


def _models_file(broken: Path, adapter: Path) -> Path:
    from gateway.engine.default_model import prepare_default_model

    smol = prepare_default_model()
    text = f"""
default = "smol"
[models.smol]
source = "default"
[models.b]
source = "{smol}"
adapters = "pirate={adapter}"
[models.c]
source = "{smol}"
[models.zero]
source = "{smol}"
keep_alive = 0
[models.broken]
source = "{broken}"
"""
    path = SCRATCH / "models.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def models_server(
    loop_thread: LoopThread, engine: Any, adapter_dir: Path
) -> Iterator[RunningServer]:
    broken = SCRATCH / "broken-model"
    broken.mkdir(exist_ok=True)
    (broken / "config.json").write_text('{"model_type": "no-such-architecture"}')
    settings = gateway_settings(
        MODELS_FILE=str(_models_file(broken, adapter_dir)),
        MAX_LOADED_MODELS="2",
        KV_CACHE_GIB="0.25",
    )
    running = start_server(loop_thread, settings, shared_loader(engine))
    wait_for(lambda: web.get(running.http + "/health").status_code == 200)
    yield running
    running.stop()


def _states(server: RunningServer) -> dict[str, str]:
    listed = web.get(server.http + "/v1/models").json()["data"]
    return {m["id"]: m["state"] for m in listed if "state" in m}


def _chat(server: RunningServer, model: str, **extra: Any) -> httpx.Response:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 8,
        "temperature": 0,
        **extra,
    }
    return web.post(server.http + "/v1/chat/completions", json=body)


def _zombies() -> set[int]:
    """This process's children that ended and were never reaped."""
    found = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                found.add(child.pid)
        except psutil.NoSuchProcess:  # gone (reaped) since it was listed
            pass
    return found


def _unloads(server: RunningServer, model: str, reason: str) -> float:
    return value(scrape(server.http), "gateway_model_unloads_total", model=model, reason=reason)


def test_every_configured_model_is_listed_with_its_state(models_server: RunningServer) -> None:
    states = _states(models_server)
    assert states["smol"] == "loaded"  # the default, loaded at start-up
    assert set(states) >= {"smol", "b", "c", "zero", "broken"}
    assert web.get(models_server.http + "/health").status_code == 200


def test_a_model_not_loaded_answers_its_first_request_after_its_load(
    models_server: RunningServer,
) -> None:
    assert _states(models_server)["c"] in ("unloaded", "loaded")
    answered = _chat(models_server, "c")
    assert answered.status_code == 200, answered.text
    assert answered.json()["model"] == "c" and answered.json()["choices"][0]["message"]["content"]
    assert _states(models_server)["c"] == "loaded"
    samples = scrape(models_server.http)
    assert value(samples, "gateway_model_loads_total", model="c", outcome="loaded") >= 1


def test_the_least_recently_used_idle_model_makes_room_and_loads_again(
    models_server: RunningServer,
) -> None:
    assert _chat(models_server, "b").status_code == 200  # room for two: smol and b
    evicted = _unloads(models_server, "b", "evicted")
    zombies = _zombies()
    assert _chat(models_server, "c").status_code == 200  # b, idle, makes room
    states = _states(models_server)
    assert states["c"] == "loaded" and states["b"] == "unloaded"
    assert _unloads(models_server, "b", "evicted") == evicted + 1
    assert _zombies() <= zombies  # b's engine processes are gone, reaped
    again = _chat(models_server, "b")  # loaded again, c unloaded for it
    assert again.status_code == 200 and again.json()["model"] == "b"
    states = _states(models_server)
    assert states["b"] == "loaded" and states["c"] == "unloaded"
    # the default model is pinned: never unloaded for the others
    assert states["smol"] == "loaded"
    samples = scrape(models_server.http)
    assert not any(
        name == "gateway_model_unloads_total" and dict(labels)["model"] == "smol"
        for name, labels in samples
    )


def test_a_streaming_model_is_never_unloaded_for_another(models_server: RunningServer) -> None:
    assert _chat(models_server, "b").status_code == 200  # b loaded, c not
    body = {
        "model": "b",
        "messages": [{"role": "user", "content": "Count to a thousand."}],
        "max_tokens": 96,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    waited: list[httpx.Response] = []
    with web.stream("POST", models_server.http + "/v1/chat/completions", json=body) as stream:
        lines = stream.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first.removeprefix("data: "))["model"] == "b"
        other = threading.Thread(target=lambda: waited.append(_chat(models_server, "c")))
        other.start()
        # c's load waits for b, busy streaming, to go idle
        wait_for(lambda: value(scrape(models_server.http), "gateway_model_load_waiting") >= 1)
        assert _states(models_server)["b"] == "loaded"
        rest = [
            json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: {")
        ]
    assert rest[-1]["choices"][0]["finish_reason"] == "length"  # b's stream completed whole
    other.join()
    assert waited[0].status_code == 200 and waited[0].json()["model"] == "c"
    assert _states(models_server)["b"] == "unloaded"


def test_keep_alive_zero_unloads_right_after_the_request(models_server: RunningServer) -> None:
    idle = _unloads(models_server, "zero", "idle")
    answered = _chat(models_server, "zero")
    assert answered.status_code == 200 and answered.json()["model"] == "zero"
    wait_for(lambda: _states(models_server)["zero"] == "unloaded")
    assert _unloads(models_server, "zero", "idle") == idle + 1


def test_a_broken_model_fails_naming_it_while_the_others_serve(
    models_server: RunningServer,
) -> None:
    refused = _chat(models_server, "broken")
    assert refused.status_code == 503
    assert "broken" in refused.json()["error"]["message"]
    assert _states(models_server)["broken"] == "failed"
    assert _chat(models_server, "smol").status_code == 200
    assert _chat(models_server, "b").status_code == 200


def test_an_unknown_model_is_404_naming_what_is_served(models_server: RunningServer) -> None:
    missing = _chat(models_server, "no-such-model")
    assert missing.status_code == 404
    assert "`b`" in missing.json()["error"]["message"]  # the models it serves are named


def test_a_request_id_is_bound_to_the_model_it_was_made_on(models_server: RunningServer) -> None:
    with connect(models_server.ws + "/ws") as ws:
        ws.send(payload(("bound-1", "Hello"), generation_config={"max_new_tokens": 2}))
        frames = frames_until_done(ws, {"bound-1"})
    assert events_of(frames, "bound-1")[-1]["type"] != "ERROR"
    with connect(models_server.ws + "/ws?model=b") as ws:
        ws.send(payload(("bound-1", ""), generation_config={"max_new_tokens": 2}))
        frames = frames_until_done(ws, {"bound-1"})
    last = events_of(frames, "bound-1")[-1]
    assert last["type"] == "ERROR" and "`smol`" in last["error"]
    assert "X-Model" in last["error"]


def test_the_x_model_header_picks_a_model_for_protocols_that_name_none(
    models_server: RunningServer,
) -> None:
    def answered_by_c() -> float:
        samples = scrape(models_server.http)
        return value(
            samples, "gateway_model_requests_total", model="c", task="generate", outcome="ok"
        )

    body = {"inputs": "Hello", "parameters": {"max_new_tokens": 2}}
    before = answered_by_c()
    picked = web.post(models_server.http + "/generate", json=body, headers={"X-Model": "c"})
    assert picked.status_code == 200, picked.text
    assert answered_by_c() == before + 1  # c's engine answered it, not the default's
    assert _states(models_server)["c"] == "loaded"
    unknown = web.post(models_server.http + "/generate", json=body, headers={"X-Model": "nope"})
    assert unknown.status_code == 404


def test_an_adapter_of_the_second_model_picks_that_model(models_server: RunningServer) -> None:
    from gateway_bench.adapter_recipe import PHRASE

    answered = _chat(models_server, "pirate", max_tokens=16)
    assert answered.status_code == 200, answered.text
    assert answered.json()["model"] == "pirate"
    assert PHRASE.strip() in answered.json()["choices"][0]["message"]["content"]
    assert _states(models_server)["b"] == "loaded"
    listed = web.get(models_server.http + "/v1/models").json()["data"]
    assert {"id": "pirate", "parent": "b"}.items() <= next(
        m for m in listed if m["id"] == "pirate"
    ).items()
    plain = _chat(models_server, "smol", max_tokens=16)
    assert PHRASE.strip() not in plain.json()["choices"][0]["message"]["content"]


def test_a_priority_class_applies_on_the_second_model(models_server: RunningServer) -> None:
    def admitted(samples: dict[Any, float]) -> float:
        return value(samples, "gateway_class_queue_seconds_count", priority="7")

    before = admitted(scrape(models_server.http))
    answered = _chat(models_server, "c", priority=7)
    assert answered.status_code == 200, answered.text
    assert admitted(scrape(models_server.http)) == before + 1  # admitted in class 7
    behind = _chat(models_server, "c", priority=-1)  # no such class: refused naming it
    assert behind.status_code == 400 and "priority" in behind.text


def test_a_control_session_naming_an_unloaded_model_sees_it_load(
    models_server: RunningServer,
) -> None:
    from control_client import until

    wait_for(lambda: _states(models_server)["zero"] == "unloaded")  # keep_alive 0
    asked = json.dumps(
        {"type": "config", "prompt": "Hello", "model": "zero", "parameters": {"max_new_tokens": 2}}
    )
    with connect(models_server.ws + "/generate") as ws:
        ws.send(asked)
        seen = until(ws, "completion", "error")
    kinds = [m["type"] for m in seen]
    loading = [m for m in seen if m["type"] == "status" and m["operation"] == "model_loading"]
    assert loading and "zero" in loading[0]["message"]
    assert kinds.index("status") < kinds.index("init") and seen[-1]["type"] == "completion"
    assert next(m for m in seen if m["type"] == "init")["model"] == "zero"
