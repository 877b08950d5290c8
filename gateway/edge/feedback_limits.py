"""How much feedback a caller may leave: at most FEEDBACK_MAX_TEXT_BYTES of `text` a message,
and FEEDBACK_PER_MINUTE messages a key (a connection without keys; 0: no limit), counted in
the same sliding minute as the generation limits (gateway/edge/limits.py). The store bounds
the whole (gateway/stores/feedback.py)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from gateway.edge.limits import Limiter, Limits, RateLimited
from protocols.errors import invalid


class FeedbackLimits:
    def __init__(
        self, max_text_bytes: int, per_minute: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_text_bytes = max_text_bytes
        self.per_minute = per_minute
        self._limits = Limits(per_minute=per_minute)
        self._messages = Limiter(clock)  # each message counted as a prompt that ends at once

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
        try:
            self._messages.acquire(caller, self._limits)
        except RateLimited as e:
            raise RateLimited(
                f"Over this key's limit of {self.per_minute} feedback messages a minute "
                f"(FEEDBACK_PER_MINUTE); retry in {math.ceil(e.retry_after)} s",
                e.retry_after,
            ) from None
        self._messages.release(caller, self._limits, 0)
