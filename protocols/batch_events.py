"""WS `/ws` (batch-events-ws.md): the server's event arrays.

Each frame is a JSON array of events of one type, "equivalent to the prompts array":
`PayloadFrames` turns a payload's neutral events into ACCEPTED (with an ERROR array for the
prompts that failed validation) once every prompt is checked; STARTED and INITIALIZED once
each, covering every accepted prompt; PROGRESS one event per prompt that produced text in a
step; and COMPLETE (with an ERROR array for prompts that failed after acceptance) once, when
the last prompt ends. No frame holds two events for one request_id.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from protocols.batch_payload import Rejected
from protocols.events import Delta, Event, Failed, Finished, Initialized, Queued, Started
from protocols.generation import PromptItem


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
    request_id: str  # NO_ID when no request_id could be read
    error: str


# The spec types every request_id as a string: an ERROR that can name no prompt (the payload is
# not JSON, names no prompts, or an entry has no string request_id) says "".
NO_ID = ""


WireEvent = Accepted | StartedEvent | InitializedEvent | Progress | Complete | ErrorEvent
Frame = list[WireEvent]

_ENCODER = msgspec.json.Encoder()
_FRAME_DECODER = msgspec.json.Decoder(list[WireEvent])


def encode_frame(frame: Sequence[WireEvent]) -> bytes:
    return _ENCODER.encode(frame)


def decode_frame(data: bytes | str) -> Frame:
    """The client's side of the codec, used by tests and Python clients."""
    return _FRAME_DECODER.decode(data)


class PayloadFrames:
    """One payload's frames, from its events as they come (`rejected`: failed decoding)."""

    def __init__(
        self, items: Sequence[PromptItem], rejected: Sequence[Rejected], *, only_new_tokens: bool
    ) -> None:
        self._ids = [item.request_id for item in items]
        self._only_new_tokens = only_new_tokens
        self._unchecked = set(range(len(items)))
        self._refused: Frame = [
            ErrorEvent(NO_ID if r.request_id is None else r.request_id, r.error.message)
            for r in rejected
        ]
        self._accepted: list[int] = []
        self._started: dict[int, WireEvent] = {}
        self._initialized: dict[int, WireEvent] = {}
        self._progress: dict[int, str] = {}
        self._done: dict[int, Complete | ErrorEvent] = {}
        self._phase = 0  # how many of ACCEPTED, STARTED, INITIALIZED were sent

    def abandon(self, message: str) -> list[Frame]:
        """The payload's last frames when it must end at once (a bug, a client that does not
        read): every accepted prompt without its end gets an ERROR with `message`, after the
        COMPLETE array of those that finished. Before the ACCEPTED array went out, every prompt
        is refused instead: one ERROR array, and none was accepted."""
        if self._phase == 0:
            self._phase = 4
            waiting = sorted({*self._unchecked, *self._accepted})
            refused = self._refused + [ErrorEvent(self._ids[i], message) for i in waiting]
            return [refused] if refused else []
        if self._phase > 3:
            return []
        for i in self._accepted:
            self._done.setdefault(i, ErrorEvent(self._ids[i], message))
        if self._phase < 3:  # STARTED or INITIALIZED never went out for every prompt
            self._progress.clear()
            self._phase = 3
        return self.frames([])

    def frames(self, step: Sequence[Event]) -> list[Frame]:
        for event in step:
            self._note(event)
        out: list[Frame] = []
        if self._phase == 0 and not self._unchecked:
            out += [[Accepted(self._ids[i]) for i in sorted(self._accepted)], self._refused]
            self._phase = 1
        for phase, events in ((1, self._started), (2, self._initialized)):
            if self._phase != phase:
                continue
            ended_before = sum(i not in events for i in self._done)
            if len(events) + ended_before == len(self._accepted):
                out.append([events[i] for i in sorted(events)])
                self._phase += 1
        if self._phase == 3 and self._progress:
            out.append([Progress(self._ids[i], t) for i, t in sorted(self._progress.items())])
            self._progress.clear()
        if self._phase == 3 and len(self._done) == len(self._accepted):
            ends = [self._done[i] for i in sorted(self._done)]
            out += [[e for e in ends if isinstance(e, Complete)]]
            out += [[e for e in ends if isinstance(e, ErrorEvent)]]
            self._phase = 4
        return [frame for frame in out if frame]

    def _note(self, event: Event) -> None:
        index, request_id = event.index, self._ids[event.index]
        match event:
            case Queued():
                self._unchecked.discard(index)
                self._accepted.append(index)
            case Failed(message=message) if index in self._unchecked:
                self._unchecked.discard(index)
                self._refused.append(ErrorEvent(request_id, message))
            case Started():
                self._started[index] = StartedEvent(request_id)
            case Initialized(prompt_text=prompt_text):
                text = "" if self._only_new_tokens else prompt_text
                self._initialized[index] = InitializedEvent(request_id, text)
            case Delta(text=text) if text:
                self._progress[index] = self._progress.get(index, "") + text
            case Finished(history=after, sequences=[new, *_]):
                text = new.text if self._only_new_tokens else after.text
                elapsed = round(event.execution_time, 3)
                is_eos = after.ended_at_eos
                self._done[index] = Complete(
                    request_id, text, is_eos, new.generated_tokens, elapsed
                )
            case Failed(message=message):
                self._done[index] = ErrorEvent(request_id, message)
