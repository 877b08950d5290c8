"""Server-sent events framing, the one helper every SSE route uses."""

from __future__ import annotations


def sse_event(data: bytes) -> bytes:
    """One event: `data: <json>` on a single line (clients read line by line), then a blank line.

    `data` must hold no newline; msgspec's JSON encoder never writes one.
    """
    return b"data: " + data + b"\n\n"
