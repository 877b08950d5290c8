"""DJL Serving's model management API, its wire shapes: register (POST `/models?url=&model_name=`),
list (GET `/models?limit=&next_page_token=`), describe (GET `/models/{model_name}`), unregister
(DELETE `/models/{model_name}`), as DJL's ManagementRequestHandler answers them. Parameters
are query parameters; answers `{"status": ...}`; errors DJL's `ErrorResponse`
(protocols/lmi_adapters.py).

SageMaker's multi-model endpoints load a model with the same call and a JSON body instead
(`{"model_name": ..., "url": ...}`, its container contract): `registration_in_body` reads it
as the same parameters, synchronously (SageMaker waits for the 200).

The gateway serves chat and embedding models this way: `task`, its own parameter, is
`generate` or `embed` (left out: the model's config.json says, a `...ForCausalLM` generating);
a chat model registered is loaded on demand as MODELS_FILE's are (docs/MODELS.md). DJL's worker
and batching parameters are accepted and have no effect (vLLM batches continuously; one engine
per model)."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from protocols.errors import invalid
from protocols.json_body import decode_json_object
from protocols.lmi_adapters import flag, required

# A model's name is a path segment of /models/{model_name} (to describe and unregister it), a
# label of its metrics, and in every status line: bounded, printable, no `/`.
MAX_MODEL_NAME_CHARS = 256

# DJL's, then the gateway's own `task`.
REGISTER_PARAMETERS = frozenset(
    {
        "url",
        "model_name",
        "model_version",
        "engine",
        "device",
        "job_queue_size",
        "batch_size",
        "max_batch_delay",
        "max_idle_time",
        "min_worker",
        "max_worker",
        "synchronous",
        "task",
    }
)
# The gateway's statuses (loading, ready, failed) as DJL's list writes them.
# A chat model `unloaded` is loaded on its next request (docs/MODELS.md): healthy, not ready.
LIST_STATUS = {"loading": "PENDING", "ready": "READY", "failed": "FAILED", "unloaded": "UNLOADED"}
DESCRIBE_STATUS = {
    "loading": "Unhealthy",
    "ready": "Healthy",
    "failed": "Unhealthy",
    "unloaded": "Healthy",
}


class Registration(msgspec.Struct, frozen=True):
    name: str
    url: str
    synchronous: bool
    task: str | None = None  # generate or embed; None: read off the model's config.json


class ListedModel(msgspec.Struct):
    modelName: str
    modelUrl: str
    status: str
    task: str  # the gateway's: generate or embed


class ModelList(msgspec.Struct, omit_defaults=True):
    models: list[ListedModel]
    nextPageToken: str | None = None


class DescribedModel(msgspec.Struct):
    modelName: str
    modelUrl: str
    status: str
    loadedAtStartup: bool
    task: str


class Workflow(msgspec.Struct):
    workflowName: str
    models: list[DescribedModel]


def registration(query: Mapping[str, str]) -> Registration:
    """The register call's parameters (`model_name` defaults to the url's last part, as DJL
    infers it); a parameter this API does not know, or a task other than `generate` or
    `embed` (none: the model's own, from its config.json), refused."""
    for key in query:
        if key not in REGISTER_PARAMETERS:
            accepted = ", ".join(sorted(REGISTER_PARAMETERS))
            raise invalid(f"The parameter {key} is not supported (accepted: {accepted})", key)
    url = required(query, "url")
    task = query.get("task") or None
    if task not in (None, "generate", "embed"):
        raise invalid(f"task={task} is not supported: generate or embed", "task")
    name = query.get("model_name") or url.rstrip("/").rsplit("/", 1)[-1]
    check_model_name(name)
    return Registration(name, url, flag(query, "synchronous", default=True), task)


def check_model_name(name: str) -> None:
    """A name the other calls can address: 1 to MAX_MODEL_NAME_CHARS printable characters,
    no `/` (uvicorn decodes `%2F`, so such a name could never be described or unregistered)."""
    if not 0 < len(name) <= MAX_MODEL_NAME_CHARS or "/" in name or not name.isprintable():
        raise invalid(
            f"The parameter model_name must be 1 to {MAX_MODEL_NAME_CHARS} printable "
            "characters without `/`, a path segment of /models/{model_name}",
            "model_name",
        )


def registration_in_body(raw: bytes) -> Registration:
    """A register call's JSON body (SageMaker's multi-model container contract): the same
    parameters as strings (`synchronous` also as a boolean), each refused naming its key."""
    query: dict[str, str] = {}
    for key, value in decode_json_object(raw).items():
        if isinstance(value, bool) and key == "synchronous":
            value = "true" if value else "false"
        if not isinstance(value, str):
            raise invalid(f"The parameter {key} must be a string - at `$.{key}`", f"$.{key}")
        query[key] = value
    return registration(query)


def status_line(name: str, *, scheduled: bool) -> str:
    return f'Model "{name}" registration scheduled.' if scheduled else f'Model "{name}" registered.'


def unregistered(name: str) -> str:
    return f'Model or workflow "{name}" unregistered'
