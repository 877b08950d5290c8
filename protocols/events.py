"""What the gateway answers a `GenerationRequest` with: events, and the tokens and histories
they carry.

Started, Initialized, Deltas (when streamed), then one Finished or Failed. A batch of prompts
gets lists of events, each what one engine step produced, at most one event of each type per
prompt, in the order a client should see them.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Sequence
from typing import Literal

import msgspec

from protocols.errors import ErrorKind, GenerationError


class TopToken(msgspec.Struct, frozen=True):
    token_id: int
    text: str
    logprob: float
    special: bool = False


class TokenInfo(msgspec.Struct, frozen=True):
    """One token with the engine's log-probability (NaN: none), and its best alternatives."""

    token_id: int
    text: str
    logprob: float
    alternatives: tuple[TopToken, ...] = ()
    special: bool = False


class History(msgspec.Struct):
    """A sequence so far (prompt plus everything generated), to continue from."""

    # 4 bytes per token: a list would hold a pointer and an int object, about 36 bytes each
    token_ids: array[int]
    text: str
    ended_at_eos: bool = False
    adapter: str | None = None  # the LoRA adapter that generated it (None: the base model)
    model: str | None = None  # the chat model it was generated on (None: the only one)


def token_array(token_ids: Iterable[int]) -> array[int]:
    return array("i", token_ids)


class GeneratedSequence(msgspec.Struct):
    """One finished sequence of a request."""

    text: str
    generated_tokens: int
    finish_reason: str  # vLLM's: stop or length
    stop_reason: int | str | None = None
    tokens: list[TokenInfo] | None = None


class Queued(msgspec.Struct, frozen=True):
    """The prompt passed its checks as `token_ids` and waits for admission to the engine."""

    index: int
    token_ids: Sequence[int] = ()


class Started(msgspec.Struct, frozen=True):
    """The prompt left the gateway's queue and was handed to the engine."""

    index: int


class Initialized(msgspec.Struct, frozen=True):
    """The engine finished the prompt's prefill; `prompt_text` is the whole sequence so far."""

    index: int
    prompt_text: str


class Delta(msgspec.Struct):
    """What the engine added since this prompt's last event (several steps may be merged)."""

    index: int
    text: str
    token_ids: list[int]
    tokens: list[TokenInfo] | None = None  # with log-probabilities, when asked for
    # Set on the prompt's last Delta (vLLM's: stop or length); its Finished follows at once.
    finish_reason: str | None = None


class Finished(msgspec.Struct):
    """The prompt's end: the whole `history` after it, every sequence generated (one, or `n`,
    or the beams best first; the first continues the history; with their tokens when not
    streamed and log-probabilities were asked for), and the prompt's tokens when prompt
    log-probabilities were; `cached_tokens`: how many prompt tokens the engine's prefix cache
    held."""

    index: int
    history: History
    sequences: list[GeneratedSequence]
    prompt_tokens: int
    execution_time: float
    prefill: list[TokenInfo] | None = None
    cached_tokens: int = 0


class Failed(msgspec.Struct, frozen=True):
    """`field` is relative to the prompt's entry (e.g. "prompt"), or None."""

    index: int
    kind: ErrorKind
    message: str
    field: str | None = None

    def error(self) -> GenerationError:
        return GenerationError(self.kind, self.message, self.field)


Event = Queued | Started | Initialized | Delta | Finished | Failed
TERMINAL = (Finished, Failed)
StopCause = Literal["length", "eos_token", "stop_sequence"]


def stop_cause(
    finish_reason: str | None, stop_reason: int | str | None, stop_token_ids: Sequence[int]
) -> StopCause:
    """Why a sequence ended, in the LMI / TGI words: length, eos_token or stop_sequence."""
    if finish_reason != "stop":
        return "length"
    if isinstance(stop_reason, str) or (
        isinstance(stop_reason, int) and stop_reason in stop_token_ids
    ):
        return "stop_sequence"
    return "eos_token"


def best_sequences(
    finished: Finished, keep: int, *, by_mean: bool = False
) -> list[GeneratedSequence]:
    """The best `keep` sequences, best first, by total (or mean) token log-probability (not
    for beams: they come ranked by their own length-normalised score)."""

    def score(sequence: GeneratedSequence) -> float:
        known = [t.logprob for t in sequence.tokens or () if not math.isnan(t.logprob)]
        return sum(known) / max(len(known), 1) if by_mean else sum(known)

    return sorted(finished.sequences, key=score, reverse=True)[:keep]


def top_tokens(token: TokenInfo, k: int) -> list[TopToken]:
    """The `k` most likely tokens at this position, the chosen one included if among them."""
    chosen = TopToken(token.token_id, token.text, token.logprob, token.special)
    return sorted((chosen, *token.alternatives), key=lambda t: -t.logprob)[:k]
