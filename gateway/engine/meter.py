"""What the engine reports of each request as it runs: the `Meter` its caller hands it
(gateway/engine_path/metrics.py's `StreamMeter` turns it into Prometheus figures)."""

from __future__ import annotations

from typing import Protocol

from gateway.observability.tracing import Span


class Meter(Protocol):
    outcome: str  # "cancelled" until the request finishes ("ok") or fails (its error kind)
    span: Span | None  # the prompt's span: the engine's phases are its children (None: untraced)

    def started(self, prompt_tokens: int) -> None:
        """The engine request was submitted: `ended` must follow."""

    def step(self, new_tokens: int, cached_tokens: int, finished: bool) -> None:
        """An output of `new_tokens` tokens; `finished` on the last."""

    def ended(self) -> None:
        """The engine request is over, however it ended."""
