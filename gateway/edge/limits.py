"""Per-caller limits: concurrent sequences, prompts a minute, generated tokens a minute.

A caller is an API key, or one connection when the gateway has no keys. Every limit is 0 for
none. The minute is a sliding window. Concurrency counts engine sequences: a prompt asking for
`n`, `best_of` or `num_beams` of them holds that many (gateway/engine_path/sequences.py);
a minute counts prompts, and every token each of their sequences generated. Going over refuses
the new prompt with RATE_LIMITED and says when to retry; a caller's limits never touch another
caller's prompts.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from protocols.errors import ErrorKind, GenerationError

WINDOW_SECONDS = 60.0
# What `key:name concurrent=2 rpm=30 tpm=5000` in the keys file overrides.
_PRUNE_PAST = 1024  # callers tracked before the idle ones are looked for
OVERRIDE_NAMES = {"concurrent": "concurrent", "rpm": "per_minute", "tpm": "tokens_per_minute"}


@dataclass(frozen=True)
class Limits:
    concurrent: int = 0
    per_minute: int = 0
    tokens_per_minute: int = 0


NO_LIMITS = Limits()


class RateLimited(GenerationError):
    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(ErrorKind.RATE_LIMITED, message)
        self.retry_after = retry_after


@dataclass
class _Usage:
    running: int = 0
    started: deque[float] = field(default_factory=deque)
    tokens: deque[tuple[float, int]] = field(default_factory=deque)

    @property
    def idle(self) -> bool:
        return not self.running and not self.started and not self.tokens

    def forget_before(self, since: float) -> None:
        while self.started and self.started[0] <= since:
            self.started.popleft()
        while self.tokens and self.tokens[0][0] <= since:
            self.tokens.popleft()


class Limiter:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._usage: dict[str, _Usage] = {}

    def acquire(self, caller: str, limits: Limits, sequences: int = 1) -> None:
        """Counts a new prompt of `caller` in, running `sequences` at once, or raises
        `RateLimited`: `release` follows, with the same `sequences`."""
        if limits == NO_LIMITS:
            return
        now = self._clock()
        usage = self._usage.setdefault(caller, _Usage())
        usage.forget_before(now - WINDOW_SECONDS)
        if limits.concurrent and usage.running + sequences > limits.concurrent:
            raise RateLimited(
                f"Too many sequences at once: this key's limit is {limits.concurrent} (each of "
                f"a prompt's n, best_of or num_beams sequences counts), {usage.running} running "
                f"and {sequences} asked for; retry when one ends",
                1.0,
            )
        if limits.per_minute and len(usage.started) >= limits.per_minute:
            wait = usage.started[0] + WINDOW_SECONDS - now
            raise RateLimited(_per_minute(f"{limits.per_minute} prompts", wait), wait)
        used = sum(n for _, n in usage.tokens)
        if limits.tokens_per_minute and used >= limits.tokens_per_minute:
            wait, left = 0.0, used
            for at, n in usage.tokens:  # when enough of the window's tokens have aged out
                left -= n
                wait = at + WINDOW_SECONDS - now
                if left < limits.tokens_per_minute:
                    break
            raise RateLimited(_per_minute(f"{limits.tokens_per_minute} tokens", wait), wait)
        usage.running += sequences
        if limits.per_minute:
            usage.started.append(now)
        if len(self._usage) > _PRUNE_PAST:
            self._prune(now)

    def release(
        self, caller: str, limits: Limits, generated_tokens: int, sequences: int = 1
    ) -> None:
        if limits == NO_LIMITS:
            return
        usage = self._usage[caller]
        usage.running -= sequences
        if generated_tokens and limits.tokens_per_minute:
            usage.tokens.append((self._clock(), generated_tokens))
        if usage.idle:
            del self._usage[caller]

    def __len__(self) -> int:
        self._prune(self._clock())
        return len(self._usage)

    def _prune(self, now: float) -> None:
        """Forget callers with nothing in the window: a gone connection leaves with its minute."""
        for name in list(self._usage):
            usage = self._usage[name]
            usage.forget_before(now - WINDOW_SECONDS)
            if usage.idle:
                del self._usage[name]


def _per_minute(what: str, wait: float) -> str:
    return f"Over this key's limit of {what} a minute; retry in {math.ceil(wait)} s"
