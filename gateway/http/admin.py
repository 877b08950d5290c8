"""The admin key check every adapter and model management route asks (docs/ADAPTERS.md,
docs/EMBEDDINGS.md): only a key of ADMIN_API_KEYS may load or unload adapters or models (none
set: refused); API_KEYS' keys cannot."""

from __future__ import annotations

import hmac
from typing import NamedTuple

import msgspec
from starlette.requests import Request

from gateway.edge.api_keys import presented_key
from gateway.http.prepared import JSON, Whole
from gateway.state import gateway_of
from protocols.lmi_adapters import error_body

# Open to the API-key check (API_KEYS): these routes check ADMIN_API_KEYS themselves. LMI's
# adapter management routes (gateway/routes/lmi_adapters.py) are `/adapters...` and
# `/models/{model_name}/adapters...`, DJL's model management (routes/model_management.py)
# `/models` and `/models/{model_name}` (`+`: one path segment); `/models/{model_name}/invoke`
# (SageMaker's multi-model invocation) is an inference route, behind API_KEYS as the others.
ADMIN_PATHS = frozenset(
    {
        "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter",
        "/adapters",
        "/adapters/*",
        "/models",
        "/models/+",
        "/models/+/adapters",
        "/models/+/adapters/*",
    }
)


class Refusal(NamedTuple):
    status: int  # 401 or 403
    message: str
    kind: str  # OpenAI's error type


def admin_refusal(request: Request) -> Refusal | None:
    """None for a key of ADMIN_API_KEYS; else why not: 401 (no key) or 403 (a key that is not
    an admin's, or no ADMIN_API_KEYS at all)."""
    admins = [k.strip() for k in gateway_of(request).settings.admin_api_keys.split(",")]
    admins = [k for k in admins if k]
    if not admins:
        message = (
            "Adapters and models are loaded at start-up only: ADMIN_API_KEYS names no admin key"
        )
        return Refusal(403, message, "permission_error")
    key = presented_key(request.scope)
    if key is None:
        return Refusal(401, "An admin key is required (ADMIN_API_KEYS)", "authentication_error")
    if not any(hmac.compare_digest(key.encode(), a.encode()) for a in admins):
        return Refusal(403, "This key may not manage adapters or models", "permission_error")
    return None


def djl_json(value: object, status: int = 200) -> Whole:
    """An answer of DJL Serving's management APIs."""
    return Whole(status, msgspec.json.encode(value), JSON)


def djl_error(status: int, message: str, kind: str) -> Whole:
    """An error of DJL Serving's management APIs (their `ErrorResponse`, `kind` its `type`)."""
    return Whole(status, error_body(status, message, kind), JSON)


def djl_admin_refusal(request: Request) -> Whole | None:
    """`admin_refusal` as DJL Serving's management APIs answer it (their `ErrorResponse`):
    LMI's adapter routes and DJL's model routes."""
    refusal = admin_refusal(request)
    if refusal is None:
        return None
    kind = "Unauthorized" if refusal.status == 401 else "Forbidden"
    return djl_error(refusal.status, refusal.message, kind)
