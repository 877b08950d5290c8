"""Priority classes: which door a request came through decides who goes first.

A class is a number, lower first (vLLM's own convention): by default 0 for the interactive
protocols (a person is waiting for the first token), 1 for single prompts, 2 for bulk work.
`PRIORITY_<PROTOCOL>` sets a protocol's class. A request may ask for a number of its own where
its protocol has a field for it (docs/PRIORITIES.md), but never for one ahead of its
protocol's class: a caller can only step back, never outrank the operator's classes.
"""

from __future__ import annotations

from collections.abc import Mapping

from protocols.names import Protocol

INTERACTIVE, STANDARD, BULK = 0, 1, 2
MAX_PRIORITY = 9  # bounds the labels a per-class metric can have

# Every protocol has its row (tests/test_protocol_tables.py): `PriorityClasses.of` has no
# fallback, so a protocol without one would fail each of its requests.
DEFAULT_CLASSES: Mapping[Protocol, int] = {
    Protocol.CONTROL: INTERACTIVE,
    Protocol.WS_EVENTS: INTERACTIVE,
    Protocol.V1_GENERATE: INTERACTIVE,
    Protocol.OPENAI_CHAT: INTERACTIVE,
    Protocol.OPENAI_RESPONSES: INTERACTIVE,
    Protocol.ANTHROPIC_MESSAGES: INTERACTIVE,
    Protocol.COHERE_CHAT: INTERACTIVE,
    Protocol.OLLAMA: INTERACTIVE,
    Protocol.TGI: INTERACTIVE,
    Protocol.WS: STANDARD,
    Protocol.API_GENERATE_ONE: STANDARD,
    Protocol.OPENAI_COMPLETIONS: STANDARD,
    Protocol.API_GENERATE_BATCH: BULK,
    Protocol.LMI: BULK,
    Protocol.SAGEMAKER: BULK,
}


class PriorityClasses:
    """Each protocol's class; `enabled=False` puts every request in one class (FCFS)."""

    def __init__(self, classes: Mapping[Protocol, int], *, enabled: bool = True) -> None:
        self.enabled = enabled
        self._classes = {**DEFAULT_CLASSES, **classes}

    def of(self, protocol: Protocol, requested: int | None = None) -> int:
        if not self.enabled:
            return 0
        floor = self._classes[protocol]
        if requested is None:
            return floor
        return min(max(floor, requested), MAX_PRIORITY)


def parse_classes(values: Mapping[str, str]) -> dict[Protocol, int]:
    """`PRIORITY_<PROTOCOL>=<0..9>` from environment-style values; ValueError names the bad one."""
    classes: dict[Protocol, int] = {}
    for protocol in Protocol:
        name = f"PRIORITY_{protocol.name}"
        raw = values.get(name, "")
        if raw == "":
            continue
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"{name}: expected an integer from 0 to {MAX_PRIORITY}") from None
        if not 0 <= value <= MAX_PRIORITY:
            raise ValueError(f"{name}: expected an integer from 0 to {MAX_PRIORITY}")
        classes[protocol] = value
    return classes
