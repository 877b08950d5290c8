"""DJL Serving's (LMI's) adapter management API, its wire shapes: register (POST
`/adapters?name=&src=`), list (GET `/adapters?limit=&next_page_token=`), describe (GET
`/adapters/{name}`), update (POST `/adapters/{name}/update`), unregister (DELETE
`/adapters/{name}`), each also under `/models/{model_name}`. Its parameters are query
parameters; its answers `{"status": ...}`, its errors DJL's `ErrorResponse`
(`{"code", "type", "message"}`, the status repeated in `code`), as DJL's
AdapterManagementRequestHandler writes them."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from protocols.errors import GenerationError, invalid, named

MAX_PAGE = 100  # DJL's ListPagination: the default limit, and the largest
REGISTER_PARAMETERS = frozenset({"name", "src", "preload", "pin"})
UPDATE_PARAMETERS = frozenset({"src", "preload", "pin"})
LIST_PARAMETERS = frozenset({"limit", "next_page_token"})
# The field names of the engine's adapter errors, in DJL's parameter names.
_FIELDS = {"lora_name": "name", "lora_path": "src"}


class Status(msgspec.Struct):
    status: str


class AdapterItem(msgspec.Struct):
    """One adapter, as describe answers it and list lists it."""

    name: str
    src: str
    preload: bool = True  # the gateway loads every adapter when it is registered
    pin: bool = False


class AdapterList(msgspec.Struct, omit_defaults=True):
    adapters: list[AdapterItem]
    nextPageToken: str | None = None  # DJL's name (Gson writes field names)


class ErrorResponse(msgspec.Struct):
    code: int
    type: str
    message: str


def error_body(status: int, message: str, kind: str = "BadRequestException") -> bytes:
    return msgspec.json.encode(ErrorResponse(status, kind, message))


def not_found(name: str) -> bytes:
    """DJL's answer for an adapter it does not have (with status 404)."""
    return error_body(404, f"The adapter {name} was not found")


def djl_field(error: GenerationError) -> GenerationError:
    """The engine's refusal in DJL's parameter names (`lora_path` is `src` here), its message
    naming the parameter (DJL's error body has no field of its own)."""
    field = _FIELDS.get(error.field or "")
    if field is None:
        return error
    message = error.message.replace(f"`{error.field}`", f"`{field}`")
    return GenerationError(error.kind, named(GenerationError(error.kind, message, field)), field)


def required(query: Mapping[str, str], key: str) -> str:
    """A required query parameter; DJL's message when it is missing or empty."""
    value = query.get(key, "")
    if not value:
        raise invalid(f"The parameter {key} is required", key)
    return value


def only(query: Mapping[str, str], known: frozenset[str]) -> None:
    """Refuses a parameter the route does not know (DJL passes them to its Python handler as
    model options; the gateway's engine has none), naming it."""
    for key in query:
        if key not in known:
            accepted = ", ".join(sorted(known)) or "none"
            raise invalid(f"The parameter {key} is not supported (accepted: {accepted})", key)


def load_options(query: Mapping[str, str]) -> None:
    """`preload` and `pin` as the gateway serves every adapter: loaded at once (preload
    true), never pinned (vLLM's LRU of MAX_LORAS applies to all alike)."""
    if not flag(query, "preload", default=True):
        message = "preload=false is not supported: adapters are loaded when registered"
        raise invalid(message, "preload")
    if flag(query, "pin", default=False):
        raise invalid("pin=true is not supported: no adapter is pinned", "pin")


def flag(query: Mapping[str, str], key: str, *, default: bool) -> bool:
    value = query.get(key)
    if value is None or value == "":
        return default
    if value.lower() not in ("true", "false"):
        raise invalid(f"The parameter {key} must be true or false, not `{value}`", key)
    return value.lower() == "true"


def page(query: Mapping[str, str], count: int) -> tuple[int, int]:
    """DJL's ListPagination: the slice [first, last) of `count` items; a limit past 100 or
    below 1 is 100, a negative token 0. (DJL keeps a limit of 0: an empty page whose
    nextPageToken is the token asked with, which a client following it asks for forever.)"""
    limit = _integer(query, "limit", MAX_PAGE)
    first = max(_integer(query, "next_page_token", 0), 0)
    if limit > MAX_PAGE or limit < 1:
        limit = MAX_PAGE
    return first, min(first + limit, count)


def _integer(query: Mapping[str, str], key: str, default: int) -> int:
    value = query.get(key)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise invalid(f"The parameter {key} must be an integer, not `{value}`", key) from None
