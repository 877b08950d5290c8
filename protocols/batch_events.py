"""WS `/ws` (batch-events-ws.md): the server's event arrays.

Each frame is a JSON array of events of one phase. `to_frames` turns one engine step of
neutral events into frames, in the order STARTED, INITIALIZED, PROGRESS, then the terminal
COMPLETE / ERROR, so no frame holds two events for one request_id.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from protocols.batch_payload import Rejected
from protocols.generation import Delta, Event, Failed, Finished, Initialized, PromptItem, Started


class Accepted(msgspec.Struct, tag_field="type", tag="ACCEPTED"):
    request_id: str


class StartedEvent(msgspec.Struct, tag_field="type", tag="STARTED"):
    request_id: str


class InitializedEvent(msgspec.Struct, tag_field="type", tag="INITIALIZED"):
    request_id: str
    text: str


class Progress(msgspec.Struct, tag_field="type", tag="PROGRESS"):
    request_id: str
    text: str


class Complete(msgspec.Struct, tag_field="type", tag="COMPLETE"):
    request_id: str
    text: str
    is_eos: bool
    new_tokens_count: int
    execution_time: float


class ErrorEvent(msgspec.Struct, tag_field="type", tag="ERROR"):
    request_id: str | None
    error: str


WireEvent = Accepted | StartedEvent | InitializedEvent | Progress | Complete | ErrorEvent
Frame = list[WireEvent]

_ENCODER = msgspec.json.Encoder()
_FRAME_DECODER = msgspec.json.Decoder(list[WireEvent])


def encode_frame(frame: Sequence[WireEvent]) -> bytes:
    return _ENCODER.encode(frame)


def decode_frame(data: bytes | str) -> Frame:
    """The client's side of the codec, used by tests and Python clients."""
    return _FRAME_DECODER.decode(data)


def accepted_frame(items: Sequence[PromptItem]) -> Frame:
    return [Accepted(item.request_id) for item in items]


def rejected_frame(rejected: Sequence[Rejected]) -> Frame:
    return [ErrorEvent(r.request_id, r.error.message) for r in rejected]


def to_frames(
    events: Sequence[Event], items: Sequence[PromptItem], *, only_new_tokens: bool
) -> list[Frame]:
    frames: tuple[Frame, Frame, Frame, Frame] = ([], [], [], [])
    started, initialized, progress, terminal = frames
    for event in events:
        request_id = items[event.index].request_id
        match event:
            case Delta(text=text) if text:
                progress.append(Progress(request_id, text))
            case Started():
                started.append(StartedEvent(request_id))
            case Initialized(prompt_text=prompt_text):
                initialized.append(
                    InitializedEvent(request_id, "" if only_new_tokens else prompt_text)
                )
            case Finished(history=after, sequences=[new, *_]):
                text = new.text if only_new_tokens else after.text
                elapsed = round(event.execution_time, 3)
                is_eos = after.ended_at_eos
                terminal.append(Complete(request_id, text, is_eos, new.generated_tokens, elapsed))
            case Failed(message=message):
                terminal.append(ErrorEvent(request_id, message))
    return [frame for frame in frames if frame]
