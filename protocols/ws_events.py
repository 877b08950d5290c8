"""WS `/ws/events` (start-progress-ws.md): START in; START, PROGRESS, COMPLETE out.

Every frame either way is a JSON array of events (a client may also send one bare START
object). Extensions, documented in docs/PROTOCOLS.md: a START may carry `parameters` (the
batch specs' generation_config), and a bad event is answered with an ERROR event instead of
its START echo: `FrameEvents` echoes a frame's STARTs once each has passed every check.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from protocols.errors import ErrorKind, GenerationError, invalid, validation_error
from protocols.events import Delta, Failed, Finished, Queued
from protocols.events import Event as Outcome
from protocols.generation import MAX_STOP_SEQUENCES, GenerationRequest, SamplingOptions
from protocols.generation_config import (
    GenerationConfig,
    resolve_options,
    strip_generation_config,
    take_adapter,
)
from protocols.json_body import JSON_DECODER, MALFORMED, malformed

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
    """A valid START, `position` in its frame, `path` its JSON path there ("$[2]")."""

    start: Start
    options: SamplingOptions
    position: int = 0
    path: str = "$"
    adapter: str | None = None  # `parameters.adapter_id`: a LoRA adapter's name

    def request(self, index: int) -> GenerationRequest:
        """Its prompt, afresh: ids share the in-flight check under their own prefix."""
        return GenerationRequest(
            options=self.options,
            prompt=self.start.data,
            request_id=f"events:{self.start.id}",
            index=index,
            prompt_field=f"{self.path}.data",
            adapter=self.adapter,
            adapter_field=f"{self.path}.parameters.adapter_id",
        )


class Refused(msgspec.Struct, frozen=True):
    position: int
    error: Error


def decode_starts(
    raw: bytes | str, defaults: SamplingOptions, max_stop: int = MAX_STOP_SEQUENCES
) -> tuple[list[Accepted], list[Refused]]:
    """The frame's STARTs, and an ERROR for each event that is not a valid START.

    An id that appears twice in the frame is refused for each of its events, with one ERROR.
    """
    try:
        doc: Any = JSON_DECODER.decode(raw)
    except MALFORMED as e:
        return [], [Refused(0, Error(None, malformed(e, raw).message, "$"))]
    entries, prefix = (doc, "$") if isinstance(doc, list) else ([doc], "")
    if not entries:
        return [], [Refused(0, Error(None, "Expected at least one START event - at `$`", "$"))]
    ids = [_id_of(entry) for entry in entries]
    counts = Counter(i for i in ids if i is not None)
    accepted: list[Accepted] = []
    refused: list[Refused] = []
    for i, entry in enumerate(entries):
        path = f"{prefix}[{i}]" if prefix else "$"
        event_id = ids[i]
        if event_id is not None and counts[event_id] > 1:
            if ids.index(event_id) == i:
                message = f"id {event_id!r} appears more than once in the frame: no START of it ran"
                refused.append(Refused(i, Error(event_id, message, f"{path}.id")))
            continue
        try:
            adapter = None
            if isinstance(entry, dict):
                strip_generation_config(entry, "parameters", "/ws/events parameters")
                adapter = take_adapter(entry, "parameters", f"{path}.parameters")
            start = msgspec.convert(entry, StartIn)
            if not start.data:
                message = f"A START needs a prompt: `data` is empty - at `{path}.data`"
                raise invalid(message, f"{path}.data")
            options = resolve_options(
                start.parameters,
                defaults,
                streaming=True,
                path=f"{path}.parameters",
                max_stop=max_stop,
            )
        except (msgspec.ValidationError, GenerationError) as e:
            error = validation_error(e, path) if isinstance(e, msgspec.ValidationError) else e
            field: str | UnsetType = UNSET if error.field is None else error.field
            refused.append(Refused(i, Error(event_id, error.message, field)))
            continue
        accepted.append(Accepted(Start(start.id, start.data), options, i, path, adapter))
    return accepted, refused


def _id_of(entry: object) -> str | None:
    event_id = entry.get("id") if isinstance(entry, dict) else None
    return event_id if isinstance(event_id, str) else None


class FrameEvents:
    """One client frame on the wire, from the neutral events of its accepted STARTs (event
    `index` i is `accepted[i]`): the STARTs echoed in one array, and the refused events' ERRORs
    in one array after it, once every START has passed its checks or failed them (an
    over-long prompt, an id already generating), so a refused START is never echoed; then one
    array per PROGRESS, COMPLETE or ERROR."""

    def __init__(self, accepted: Sequence[Accepted], refused: Sequence[Refused]) -> None:
        self._accepted = list(accepted)
        self._unchecked = set(range(len(accepted)))
        self._passed: list[int] = []
        self._refused = list(refused)
        self._ended: set[int] = set()
        self._pending: list[list[Event]] = []
        self._echoed = False

    def abandon(self, message: str) -> list[list[Event]]:
        """The frame's last arrays when it must end at once (a bug, a client that does not
        read): every echoed START without its end gets an ERROR with `message`. Before the
        echo, every START is refused instead, in one array, and none is echoed."""
        if not self._echoed:
            self._echoed = True
            waiting = sorted({*self._unchecked, *self._passed})
            refused = self._refused + [
                Refused(self._accepted[i].position, Error(self._accepted[i].start.id, message))
                for i in waiting
            ]
            self._pending = []
            errors: list[Event] = [r.error for r in sorted(refused, key=lambda r: r.position)]
            return [errors] if errors else []
        for i in self._passed:
            if i not in self._ended:
                self._ended.add(i)
                self._pending.append([Error(self._accepted[i].start.id, message)])
        out, self._pending = self._pending, []
        return out

    def frames(self, step: Sequence[Outcome]) -> list[list[Event]]:
        for event in step:
            self._note(event)
        out: list[list[Event]] = []
        if not self._echoed and not self._unchecked:
            self._echoed = True
            out.append([self._accepted[i].start for i in sorted(self._passed)])
            out.append([r.error for r in sorted(self._refused, key=lambda r: r.position)])
        if self._echoed:
            out += self._pending
            self._pending = []
        return [frame for frame in out if frame]

    def _note(self, event: Outcome) -> None:
        index = event.index
        accepted = self._accepted[index]
        event_id = accepted.start.id
        match event:
            case Queued():
                self._unchecked.discard(index)
                self._passed.append(index)
            case Failed() if index in self._unchecked:
                self._unchecked.discard(index)
                self._refused.append(Refused(accepted.position, self._error(accepted, event)))
            case Delta(text=text) if text:
                self._pending.append([Progress(event_id, text)])
            case Finished(history=after, sequences=[new, *_]):
                self._ended.add(index)
                self._pending.append([Complete(event_id, new.text, after.ended_at_eos)])
            case Failed():
                self._ended.add(index)
                self._pending.append([self._error(accepted, event)])

    def _error(self, accepted: Accepted, failed: Failed) -> Error:
        event_id = accepted.start.id
        if failed.kind is ErrorKind.DUPLICATE_REQUEST_ID:
            message = f"id {event_id!r} is already generating: wait for its end, or use another id"
            return Error(event_id, message, f"{accepted.path}.id")
        field = f"{accepted.path}.id" if failed.field == "request_id" else failed.field
        return Error(event_id, failed.message, UNSET if field is None else field)


def encode_frame(events: list[Event]) -> bytes:
    return _ENCODER.encode(events)


def decode_frame(raw: bytes | str) -> list[Event]:
    """The client's side of the codec, for tests and Python clients."""
    return _FRAME_DECODER.decode(raw)
