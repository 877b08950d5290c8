"""Server-sent events framing, the one helper every SSE route uses."""

from __future__ import annotations


def sse_event(data: bytes, event: str | None = None) -> bytes:
    """One event: `data: <json>` on a single line (clients read line by line), then a blank line.

    `data` must hold no newline; msgspec's JSON encoder never writes one.
    """
    if event is None:
        return b"data: " + data + b"\n\n"
    return b"event: " + event.encode() + b"\ndata: " + data + b"\n\n"
