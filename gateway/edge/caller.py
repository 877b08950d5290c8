"""Who a request comes from, set once by the key check for everything that follows it.

With API keys, a caller is its key: its limits, and the owner of its request ids and
continuation histories. Without keys, a caller is its connection (for limits) and owns
nothing: request ids are shared, so a request_id is a capability (docs/SECURITY.md).
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

from gateway.edge.limits import NO_LIMITS, Limits


@dataclass
class Caller:
    id: str  # the key's SHA-256, or the connection's address
    owner: str  # the namespace of request ids: the key's SHA-256, or "" without keys
    limits: Limits
    retry_after: float | None = None  # set when a prompt of this request was rate limited
    name: str = ""  # the key's name, as logs show it (its given name, else its label)


CALLER: ContextVar[Caller | None] = ContextVar("caller", default=None)


def current_caller() -> Caller:
    """The request's caller; code run outside a request (tests, tools) is one shared caller."""
    caller = CALLER.get()
    return caller if caller is not None else Caller("", "", NO_LIMITS)
