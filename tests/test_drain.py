"""The graceful end (SIGTERM, docs/SECURITY.md): health goes 503 at once, new work is refused,
running prompts finish or end with one terminal error each, WebSockets close with 1001, and
the process exits 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from unending_streams import STREAMS, Streams
from websockets.exceptions import ConnectionClosed

from clients import CHAT, UNENDING, connect, greedy, payload, scrape, value, wait_for, web
from serving import RunningServer, free_port

SHUTTING_DOWN = "shutting down"


def closed_with(ws: Any) -> int | None:
    """The close code the server ends an idle connection with."""
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv()
    return closed.value.rcvd.code if closed.value.rcvd else None


def active_streams(server: RunningServer) -> float:
    return value(scrape(server.http), "gateway_active_streams")


@pytest.mark.long  # ~30 s of drain on the shared engine: make test-all
def test_draining_refuses_new_work_lets_running_prompts_finish_then_closes_websockets(
    make_server: Callable[..., RunningServer],
) -> None:
    server = make_server(DRAIN_SECONDS="600")
    parameters = {"max_new_tokens": 400, "ignore_eos_token": True, "do_sample": False}
    finite = {"inputs": CHAT.format("Name rivers."), "parameters": parameters}
    forever = greedy(UNENDING, ignore_eos=True)
    with (
        ThreadPoolExecutor(1) as pool,
        connect(server.ws + "/ws") as idle,
        connect(server.ws + "/ws") as busy,
    ):
        idle.send(payload(("before", "Hi"), generation_config=greedy(1)))
        while not any(e["type"] == "COMPLETE" for e in json.loads(idle.recv())):
            pass
        busy.send(payload(("forever", "Count."), generation_config=forever))
        first = busy_events = json.loads(busy.recv())
        while not any(e["type"] == "PROGRESS" for e in busy_events):
            busy_events = json.loads(busy.recv())
            assert not any(e["type"] in ("COMPLETE", "ERROR") for e in busy_events), first
        finishing = pool.submit(web.post, server.http + "/generate", json=finite)
        wait_for(lambda: finishing.done() or active_streams(server) == 2)
        server.drain()
        wait_for(lambda: web.get(server.http + "/health").status_code == 503)
        assert web.get(server.http + "/ping").json() == {"status": "draining"}
        refused = web.post(server.http + "/v1/completions", json={"prompt": "Hi"})
        assert refused.status_code == 503 and SHUTTING_DOWN in refused.json()["error"]["message"]
        with connect(server.ws + "/ws/events") as late:
            assert closed_with(late) == 1001
        answer = finishing.result()  # it was running when the drain began: it finishes, whole
        assert answer.status_code == 200 and answer.json()["generated_text"]
        assert not server.stopped()  # the unending prompt holds the drain open
        busy.close()  # its client leaves: the prompt is aborted, nothing runs any more
        assert closed_with(idle) == 1001
    wait_for(server.stopped)


def test_past_drain_seconds_each_stream_ends_with_one_terminal_error(
    make_server: Callable[..., RunningServer],
) -> None:
    server = make_server(DRAIN_SECONDS="0.5")
    kinds = STREAMS * 4  # 16 streams, every protocol
    with ThreadPoolExecutor(len(kinds)) as pool, connect(server.ws + "/generate") as control:
        streams = Streams(pool, server, kinds)
        server.drain()
        errors = streams.results()
        assert len(errors) == 16 and all(SHUTTING_DOWN in e for e in errors), errors
        assert closed_with(control) == 1001
    wait_for(server.stopped)


@pytest.mark.engine  # a real `llm-gateway serve`, engine and all
@pytest.mark.own_engine  # its own process: `make test-all`
def test_sigterm_exits_zero(tmp_path: Path) -> None:
    """The real signal on a real process (an engine that cannot load keeps it light)."""
    env = {
        **os.environ,
        "MODEL": str(tmp_path / "no-such-model"),
        "FEEDBACK_DB": str(tmp_path / "feedback.sqlite3"),
        "HF_HUB_OFFLINE": "1",
    }
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--port",
            str(port),
            "--env-file",
            "/dev/null",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        base = f"http://127.0.0.1:{port}"

        def answering() -> bool:
            try:
                return web.get(base + "/health").status_code == 503
            except httpx.TransportError:
                return process.poll() is not None

        wait_for(answering)
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        process.send_signal(signal.SIGTERM)
        output = process.communicate()[0].decode()
        assert process.returncode == 0, output
        assert "draining" in output
    finally:
        if process.poll() is None:
            process.kill()
