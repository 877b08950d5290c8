"""Ollama's residency requests with the `ollama` client on two configured models (MODELS_FILE):
a request with no prompt loads a model (`/api/ps` lists it, with its `expires_at` from the
request's keep_alive), and keep_alive 0 with no prompt unloads it. The second model is the
shipped SmolLM2 under another name, on an engine of its own."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import ollama
import pytest

from clients import wait_for, web
from serving import (
    SCRATCH,
    LoopThread,
    RunningServer,
    gateway_settings,
    shared_loader,
    start_server,
)

pytestmark = [pytest.mark.engine, pytest.mark.own_engine]


@pytest.fixture(scope="module")
def two_models(loop_thread: LoopThread, engine: Any) -> Iterator[RunningServer]:
    from gateway.engine.default_model import prepare_default_model

    path = SCRATCH / "ollama-models.toml"
    path.write_text(
        f'default = "smol"\n[models.smol]\nsource = "default"\n'
        f'[models.spare]\nsource = "{prepare_default_model()}"\n'
    )
    settings = gateway_settings(MODELS_FILE=str(path), KV_CACHE_GIB="0.25")
    running = start_server(loop_thread, settings, shared_loader(engine))
    wait_for(lambda: web.get(running.http + "/health").status_code == 200)
    yield running
    running.stop()


def _loaded(api: ollama.Client) -> dict[str, Any]:
    return {m.model or "": m for m in api.ps().models}


def test_keep_alive_loads_and_unloads_a_model(two_models: RunningServer) -> None:
    api = ollama.Client(host=two_models.http, timeout=600)
    assert "spare" not in _loaded(api)
    loaded = api.generate(model="spare", keep_alive="10m")
    assert loaded.done_reason == "load"
    running = _loaded(api)
    assert "spare" in running and running["spare"].size
    expires = running["spare"].expires_at
    assert expires is not None and expires.year < 2300  # ten minutes ahead, not forever
    answer = api.chat(
        model="spare:latest",
        messages=[{"role": "user", "content": "Say hello."}],
        options={"temperature": 0, "num_predict": 8},
    )
    assert answer.message.content and answer.model == "spare"
    unloaded = api.generate(model="spare", keep_alive=0)
    assert unloaded.done_reason == "unload"
    assert "spare" not in _loaded(api)
    # the default model is pinned: it stays
    api.generate(model="smol", keep_alive=0)
    assert "smol" in _loaded(api)
