"""Server-sent events framing, the one helper every SSE route uses."""

from __future__ import annotations


def sse_event(data: bytes, event: str | None = None) -> bytes:
    """One event: `data: <json>` on a single line (clients read line by line), then a blank line;
    with `event`, an `event: <name>` line first (the Responses API's typed events).

    `data` must hold no newline; msgspec's JSON encoder never writes one.
    """
    named = b"event: " + event.encode() + b"\n" if event else b""
    return named + b"data: " + data + b"\n\n"


def split_events(data: bytes) -> list[bytes]:
    """The events `sse_event` framed, one by one."""
    return [event + b"\n\n" for event in data.split(b"\n\n")[:-1]]
