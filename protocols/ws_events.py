"""WS `/ws/events` (start-progress-ws.md): START in; START, PROGRESS, COMPLETE out.

Every frame either way is a JSON array of events (a client may also send one bare START
object). Extensions, documented in docs/PROTOCOLS.md: a START may carry `parameters` (the
batch specs' generation_config), and a bad event is answered with an ERROR event.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from protocols.errors import GenerationError, validation_error
from protocols.generation import SamplingOptions
from protocols.generation_config import GenerationConfig, resolve_options
from protocols.json_body import MALFORMED, malformed

_JSON = msgspec.json.Decoder()
_ENCODER = msgspec.json.Encoder()


class StartIn(
    msgspec.Struct, tag="START", tag_field="type", forbid_unknown_fields=True, kw_only=True
):
    id: str
    data: str
    parameters: GenerationConfig | None = None


class Start(msgspec.Struct, tag="START", tag_field="type"):
    id: str
    data: str


class Progress(msgspec.Struct, tag="PROGRESS", tag_field="type"):
    id: str
    data: str


class Complete(msgspec.Struct, tag="COMPLETE", tag_field="type", rename={"is_eos": "isEos"}):
    id: str
    data: str
    is_eos: bool


class Error(msgspec.Struct, tag="ERROR", tag_field="type", omit_defaults=True):
    id: str | None
    data: str
    field: str | UnsetType = UNSET


Event = Start | Progress | Complete | Error
_FRAME_DECODER: msgspec.json.Decoder[list[Event]] = msgspec.json.Decoder(list[Event])


class Accepted(msgspec.Struct, frozen=True):
    start: Start
    options: SamplingOptions


def decode_starts(
    raw: bytes | str, defaults: SamplingOptions
) -> tuple[list[Accepted], list[Error]]:
    """The frame's STARTs, and an ERROR for each event that is not a valid START."""
    try:
        doc: Any = _JSON.decode(raw)
    except MALFORMED as e:
        return [], [Error(None, malformed(e).message, "$")]
    entries, prefix = (doc, "$") if isinstance(doc, list) else ([doc], "")
    if not entries:
        return [], [Error(None, "Expected at least one START event - at `$`", "$")]
    accepted: list[Accepted] = []
    errors: list[Error] = []
    for i, entry in enumerate(entries):
        path = f"{prefix}[{i}]" if prefix else "$"
        try:
            start = msgspec.convert(entry, StartIn)
            options = resolve_options(
                start.parameters, defaults, streaming=True, path=f"{path}.parameters"
            )
        except (msgspec.ValidationError, GenerationError) as e:
            error = validation_error(e, path) if isinstance(e, msgspec.ValidationError) else e
            entry_id = entry.get("id") if isinstance(entry, dict) else None
            event_id = entry_id if isinstance(entry_id, str) else None
            errors.append(error_event(event_id, error.message, error.field))
            continue
        accepted.append(Accepted(Start(start.id, start.data), options))
    return accepted, errors


def error_event(event_id: str | None, message: str, field: str | None = None) -> Error:
    """An ERROR for one START; a service `field` ("prompt") is named by its wire path."""
    wire = {"prompt": "$.data", "request_id": "$.id"}.get(field or "", field)
    return Error(event_id, message, UNSET if wire is None else wire)


def encode_frame(events: list[Event]) -> bytes:
    return _ENCODER.encode(events)


def decode_frame(raw: bytes | str) -> list[Event]:
    """The client's side of the codec, for tests and Python clients."""
    return _FRAME_DECODER.decode(raw)
