"""The HTTP status of each neutral error kind, for the gateway's own REST routes."""

from __future__ import annotations

from typing import assert_never

from protocols.errors import ErrorKind


def status_of(kind: ErrorKind) -> int:
    match kind:
        case (
            ErrorKind.INVALID_REQUEST | ErrorKind.UNPROCESSABLE | ErrorKind.CONTEXT_LENGTH_EXCEEDED
        ):
            return 422
        case ErrorKind.UNAUTHORIZED:
            return 401
        case ErrorKind.DUPLICATE_REQUEST_ID:
            return 409
        case ErrorKind.RATE_LIMITED:
            return 429
        case ErrorKind.ENGINE_ERROR:
            return 500
        case ErrorKind.ENGINE_UNAVAILABLE:
            return 503
        case _:
            assert_never(kind)
