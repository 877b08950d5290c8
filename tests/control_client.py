"""A small client for the control protocol, over a real websockets connection."""

from __future__ import annotations

import json
from typing import Any

from websockets.sync.connection import Connection

Message = dict[str, Any]


def config(prompt: str, options: dict[str, Any] | None = None, **parameters: Any) -> str:
    body: Message = {"type": "config", "prompt": prompt, "parameters": parameters}
    if options is not None:
        body["options"] = options
    return json.dumps(body)


def control(action: str, **parameters: Any) -> str:
    body: Message = {"type": "control", "action": action}
    if parameters:
        body["parameters"] = parameters
    return json.dumps(body)


def receive(ws: Connection) -> Message:
    """The next message, however long it takes to come."""
    message: Message = json.loads(ws.recv())
    return message


def until(ws: Connection, *types: str) -> list[Message]:
    """Every message up to and including the first one of `types`."""
    seen: list[Message] = []
    while True:
        message = receive(ws)
        seen.append(message)
        if message["type"] in types:
            return seen


def tokens_of(messages: list[Message]) -> list[Message]:
    return [m for m in messages if m["type"] == "token"]
