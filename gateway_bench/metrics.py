"""Per-request timings as the client sees them, and the figures of a sweep step (TTFT, ITL,
E2E: docs/BENCHMARKS.md, "The figures")."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from time import perf_counter

import msgspec

from gateway_bench.results import StepResult

FINISHED = "finished"
RATE_LIMITED = "rate_limited"
REFUSED = "refused"  # the input was refused, the error naming the field
ERROR = "error"  # anything else


class BenchError(Exception):
    """A request that failed: an error event or status, a cut stream, a timeout."""


class Record(msgspec.Struct):
    """One request as its client saw it, filled in place by a protocol client (clients.py) as
    the answer comes, so a client that leaves (its task cancelled) keeps what it saw."""

    sent: float  # just before the request (or its connection) went out
    first: float | None = None  # the first text (or the whole answer, when not streamed)
    end: float = 0.0  # when the last terminal came
    arrivals: list[float] = msgspec.field(default_factory=list)
    counts: list[int] = msgspec.field(default_factory=list)  # 0: the protocol does not say
    tokens: int = 0
    error: str | None = None  # why the request failed, once judged (`failure`)
    text: str | None = None  # the generated text, for protocols that hand it over whole
    waiting: int = 0  # counted tokens that came in reads without text (see `counted`)
    prompts: int = 1
    status: int | None = None  # HTTP status (None on WebSockets)
    terminals: list[str] = msgspec.field(default_factory=list)  # one per prompt, by kind
    named_field: bool = False  # a refusal named the token budget's field
    cut: bool = False  # the answer ended without a terminal
    message: str = ""  # the first error's text

    @property
    def ttft_s(self) -> float | None:
        """Seconds from sending to the first text; None before it."""
        return None if self.first is None else self.first - self.sent

    def ttft_ms(self) -> float:
        """The first text's delay in ms, of an answer `send` returned (it has text)."""
        assert self.first is not None, "an answer without text"
        return (self.first - self.sent) * 1000

    def arrive(self, tokens: int = 0) -> None:
        now = perf_counter()
        if self.first is None:
            self.first = now
        self.arrivals.append(now)
        self.counts.append(tokens)

    def counted(self, tokens: int, text: bool) -> None:
        """One read of a protocol that says how many tokens it carries: `tokens` came, with
        text or not. Tokens that came without text are carried by the next read with text."""
        self.waiting += tokens
        if text:
            self.arrive(self.waiting)
            self.waiting = 0

    def finish_counted(self) -> None:
        """`finish` with the tokens given to `counted`; the last text message takes any left."""
        total = sum(self.counts) + self.waiting
        if self.waiting and self.counts:
            self.counts[-1] += self.waiting
        self.waiting = 0
        self.finish(total)

    def finish(self, tokens: int) -> None:
        self.tokens = tokens
        self.terminal(FINISHED)

    def terminal(self, kind: str, message: str = "") -> None:
        self.terminals.append(kind)
        self.end = perf_counter()
        if kind != FINISHED and not self.message:
            self.message = message[:300]
        if kind == REFUSED:
            self.named_field = self.named_field or names_budget(message)

    def failure(self) -> str | None:
        """Why the request did not answer every prompt with text; None when it did."""
        if self.terminals != [FINISHED] * self.prompts:
            return self.message or ("cut: no terminal" if self.cut else "no terminal")
        if self.first is None:
            return f"the answer carried no text ({self.tokens} tokens)"
        return None


def names_budget(message: str) -> bool:
    return "max_new_tokens" in message or "max_tokens" in message


def kind_of_message(message: str) -> str:
    """An in-band error's kind, from its text (the batch protocols' errors carry no kind)."""
    lowered = message.lower()
    if "limit" in lowered and "retry" in lowered:
        return RATE_LIMITED
    return REFUSED if names_budget(message) else ERROR


def kind_of_status(status: int, message: str) -> str:
    if status == 429:
        return RATE_LIMITED
    if 400 <= status < 500:
        return REFUSED if names_budget(message) else ERROR
    return ERROR


def start() -> Record:
    return Record(perf_counter())


def failed(sent: float, error: str) -> Record:
    return Record(sent, end=perf_counter(), error=error)


def itl_samples(record: Record) -> list[float]:
    """Inter-token latencies of one request, in seconds (docs/BENCHMARKS.md, "Inter-token
    latency")."""
    times, counts = record.arrivals, record.counts
    if len(times) < 2:
        return []
    gaps = [b - a for a, b in itertools.pairwise(times)]
    if all(counts[1:]):
        out: list[float] = []
        for gap, k in zip(gaps, counts[1:], strict=True):
            out.extend([gap / k] * k)
        return out
    per_message = max(1.0, (record.tokens - (counts[0] or 1)) / len(gaps))
    return [gap / per_message for gap in gaps]


def median(values: Sequence[float], digits: int = 1) -> float | None:
    return round(statistics.median(values), digits) if values else None


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ms_at(seconds: Sequence[float], q: float, digits: int = 1) -> float | None:
    """The `q` percentile of `seconds`, in ms."""
    found = percentile(seconds, q)
    return None if found is None else round(found * 1000, digits)


def summarize(
    records: Sequence[Record], concurrency: int, wall_s: float, expected_tokens: int = 0
) -> StepResult:
    ok = [r for r in records if r.error is None]
    errors = [r.error for r in records if r.error is not None]
    tokens = sum(r.tokens for r in ok)
    ttft = [t for r in ok if (t := r.ttft_s) is not None]
    itl = [sample for r in ok for sample in itl_samples(r)]
    e2e = [r.end - r.sent for r in ok]
    return StepResult(
        concurrency=concurrency,
        requests=len(records),
        errors=len(errors),
        tokens=tokens,
        expected_tokens=expected_tokens,
        wall_s=round(wall_s, 3),
        tokens_per_s=round(tokens / wall_s, 2) if wall_s > 0 else 0.0,
        ttft_p50_ms=ms_at(ttft, 50, 2),
        ttft_p99_ms=ms_at(ttft, 99, 2),
        itl_p50_ms=ms_at(itl, 50, 2),
        itl_p99_ms=ms_at(itl, 99, 2),
        e2e_p50_ms=ms_at(e2e, 50, 2),
        e2e_p99_ms=ms_at(e2e, 99, 2),
        first_error=errors[0] if errors else None,
    )
