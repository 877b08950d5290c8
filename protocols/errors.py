"""The neutral error vocabulary that every protocol maps to its own wire shape."""

from __future__ import annotations

import enum

import msgspec


class ErrorKind(enum.StrEnum):
    INVALID_REQUEST = "invalid_request"
    UNPROCESSABLE = "unprocessable"  # well-formed, but the engine cannot do what it asks
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    RATE_LIMITED = "rate_limited"
    UNAUTHORIZED = "unauthorized"  # no API key, or not one of the gateway's
    DUPLICATE_REQUEST_ID = "duplicate_request_id"
    ENGINE_ERROR = "engine_error"
    ENGINE_UNAVAILABLE = "engine_unavailable"


class GenerationError(Exception):
    """A failure with a kind a transport can map, and the field at fault when there is one."""

    def __init__(self, kind: ErrorKind, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.field = field

    def __repr__(self) -> str:
        return f"GenerationError({self.kind.value!r}, {self.message!r}, field={self.field!r})"


def invalid(message: str, field: str | None = None) -> GenerationError:
    return GenerationError(ErrorKind.INVALID_REQUEST, message, field)


def refuse(name: str, reason: str) -> GenerationError:
    return invalid(f"{reason} - at `$.parameters.{name}`", f"$.parameters.{name}")


def named(error: GenerationError) -> str:
    """The error's message, naming its field when the message does not already."""
    if error.field and " - at `" not in error.message:
        return f"{error.message} - at `{error.field}`"
    return error.message


def split_validation_message(message: str) -> tuple[str, str]:
    """msgspec's "Expected `int` - at `$.a.b`" as ("Expected `int`", "$.a.b")."""
    head, _, tail = message.partition(" - at `")
    return head, tail.rstrip("`") if tail else "$"


def validation_error(error: msgspec.ValidationError, path: str = "$") -> GenerationError:
    """Re-root msgspec's `- at `$...`` path under `path` and keep it as the error's field."""
    head, where = split_validation_message(str(error))
    where = path + where.removeprefix("$")
    field = where
    # "Object missing required field `x`" and "... unknown field `x`" name the key itself.
    if head.startswith("Object ") and "field `" in head:
        field = f"{where}.{head.split('field `', 1)[1].rstrip('`')}"
    return invalid(f"{head} - at `{where}`", field)
