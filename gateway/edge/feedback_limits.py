"""How much feedback a caller may leave: at most FEEDBACK_MAX_TEXT_BYTES of `text` a message,
and FEEDBACK_PER_MINUTE messages a key (a connection without keys; 0: no limit), the minute a
sliding window. The store bounds the whole (gateway/stores/feedback.py)."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

from gateway.edge.limits import WINDOW_SECONDS, RateLimited
from protocols.errors import invalid

_PRUNE_PAST = 1024  # callers tracked before those with an empty window are looked for


class FeedbackLimits:
    def __init__(
        self, max_text_bytes: int, per_minute: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_text_bytes = max_text_bytes
        self.per_minute = per_minute
        self._clock = clock
        self._sent: dict[str, deque[float]] = {}

    def admit(self, caller: str, text: str | None) -> None:
        """Counts one message of `caller` in, or raises: an oversize `text` (naming the field),
        or RateLimited past the minute's messages."""
        size = len(text.encode()) if text else 0
        if size > self.max_text_bytes:
            raise invalid(
                f"Feedback `text` is {size} bytes, over {self.max_text_bytes} "
                "(FEEDBACK_MAX_TEXT_BYTES) - at `$.text`",
                "$.text",
            )
        if not self.per_minute:
            return
        now = self._clock()
        sent = self._sent.setdefault(caller, deque())
        _forget_before(sent, now - WINDOW_SECONDS)
        if len(sent) >= self.per_minute:
            wait = sent[0] + WINDOW_SECONDS - now
            raise RateLimited(
                f"Over this key's limit of {self.per_minute} feedback messages a minute "
                f"(FEEDBACK_PER_MINUTE); retry in {math.ceil(wait)} s",
                wait,
            )
        sent.append(now)
        if len(self._sent) > _PRUNE_PAST:
            self._prune(now)

    def _prune(self, now: float) -> None:
        for caller, sent in list(self._sent.items()):
            _forget_before(sent, now - WINDOW_SECONDS)
            if not sent:
                del self._sent[caller]


def _forget_before(sent: deque[float], since: float) -> None:
    while sent and sent[0] <= since:
        sent.popleft()
