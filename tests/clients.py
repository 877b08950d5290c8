"""Small client-side helpers shared by the tests: real clients, no server internals."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
TERMINAL = {"COMPLETE", "ERROR"}


def greedy(max_new_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    return {"do_sample": False, "max_new_tokens": max_new_tokens, **extra}


def payload(*prompts: tuple[str, str], **fields: Any) -> str:
    body = {"prompts": [{"request_id": r, "prompt": p} for r, p in prompts], **fields}
    return json.dumps(body)


def frames_until_done(
    ws: ClientConnection, request_ids: set[str], timeout: float = 120
) -> list[list[dict[str, Any]]]:
    """Every frame until each request_id has had its terminal event."""
    frames: list[list[dict[str, Any]]] = []
    waiting = set(request_ids)
    deadline = time.monotonic() + timeout
    while waiting:
        frame = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
        assert isinstance(frame, list) and frame, frame
        frames.append(frame)
        waiting -= {e["request_id"] for e in frame if e["type"] in TERMINAL}
    return frames


def run_ws(url: str, message: str, request_ids: set[str]) -> list[list[dict[str, Any]]]:
    with connect(url + "/ws") as ws:
        ws.send(message)
        return frames_until_done(ws, request_ids)


def events_of(frames: list[list[dict[str, Any]]], request_id: str) -> list[dict[str, Any]]:
    return [e for frame in frames for e in frame if e["request_id"] == request_id]


def wait_ready(base_url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while httpx.get(base_url + "/health").status_code != 200:
        assert time.monotonic() < deadline, "server never became ready"
        time.sleep(0.1)
