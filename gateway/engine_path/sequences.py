"""Every engine sequence counts: a request's `n`, `best_of` and `num_beams`, bounded and counted.

A request runs as many engine sequences at once as it asks for: vLLM runs `n` (or best_of)
sequences as that many requests, and beam search one engine request per beam at each step
(gateway/engine/beams.py). Each field is held to its setting (MAX_N, MAX_BEST_OF,
MAX_NUM_BEAMS), and a request that asks for more sequences than its caller may run at once is
refused, naming the field: waiting would never let it in. The caller's concurrent limit then
counts the request's sequences, not the request (gateway/edge/limits.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import assert_never

from gateway.config.settings import Settings
from protocols.errors import invalid
from protocols.generation import (
    GenerationRequest,
    SamplingOptions,
    SequenceField,
    SequencesAsked,
    sequences_asked,
)

_SETTINGS: dict[SequenceField, str] = {
    "n": "MAX_N",
    "best_of": "MAX_BEST_OF",
    "num_beams": "MAX_NUM_BEAMS",
}


@dataclass(frozen=True)
class SequenceBounds:
    """The most sequences each field may ask for."""

    n: int
    best_of: int
    num_beams: int

    @classmethod
    def of(cls, settings: Settings) -> SequenceBounds:
        return cls(settings.max_n, settings.max_best_of, settings.max_num_beams)

    def bound(self, name: SequenceField) -> int:
        match name:
            case "n":
                return self.n
            case "best_of":
                return self.best_of
            case "num_beams":
                return self.num_beams
            case _:
                assert_never(name)


def engine_sequences(options: SamplingOptions) -> int:
    """The sequences one engine request of these options runs at once."""
    return options.num_beams if options.num_beams > 1 else options.n


def checked_sequences(request: GenerationRequest, bounds: SequenceBounds, concurrent: int) -> int:
    """The sequences `request` runs at once, for the caller's concurrent limit (`concurrent`,
    0 for none); raises INVALID_REQUEST naming the field past its bound or past the limit."""
    options = request.options
    # A request that names none of its counts is named by its options' own fields.
    asked = request.asked or sequences_asked("$", n=options.n, num_beams=options.num_beams)
    for given in asked:
        bound = bounds.bound(given.name)
        if given.count > bound:
            raise invalid(
                f"`{given.name}` must be > 0 and <= {bound} (this server's "
                f"{_SETTINGS[given.name]}). Given: {given.count} - at `{given.field}`",
                given.field,
            )
    sequences = engine_sequences(options)
    largest = max(asked, key=_count, default=None)
    if concurrent and largest is not None and largest.count > concurrent:
        raise invalid(
            f"`{largest.name}` asks for {largest.count} sequences at once, more than this key's "
            f"limit of {concurrent} concurrent sequences: each sequence counts - at "
            f"`{largest.field}`",
            largest.field,
        )
    return sequences


def _count(asked: SequencesAsked) -> int:
    return asked.count
