"""The one place that maps neutral error kinds to HTTP status codes."""

from __future__ import annotations

from protocols.errors import ErrorKind

STATUS = {
    ErrorKind.INVALID_REQUEST: 422,
    ErrorKind.CONTEXT_LENGTH_EXCEEDED: 422,
    ErrorKind.DUPLICATE_REQUEST_ID: 409,
    ErrorKind.RATE_LIMITED: 429,
    ErrorKind.ENGINE_ERROR: 500,
    ErrorKind.ENGINE_UNAVAILABLE: 503,
}


def status_of(kind: ErrorKind) -> int:
    return STATUS.get(kind, 500)
