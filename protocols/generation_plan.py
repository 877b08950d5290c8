"""What the LMI and TGI routes ask of the engine, and what comes back, free of either wire format.

A request decodes into a `GenerationPlan`; the engine's work comes back as `Piece`s (streamed)
or one `Generation`, which each protocol's encoder writes in its own shape.
"""

from __future__ import annotations

import msgspec

from protocols.errors import GenerationError
from protocols.generation import SamplingOptions, TokenInfo, TopToken


class GenerationPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What to ask the engine for one prompt: `sequences` generated, the best `returned` kept."""

    options: SamplingOptions
    sequences: int = 1
    returned: int = 1
    beam: bool = False
    truncate: int | None = None  # keep only the last `truncate` prompt tokens
    top_n: int = 0  # best alternatives reported per generated token
    prefill: bool = False  # report the prompt's tokens with their log-probabilities
    rank_by_mean: bool = False  # rank sequences by mean (TGI) rather than total log-probability


class Generated(msgspec.Struct):
    """One finished sequence; `finish_reason` is length, eos_token or stop_sequence."""

    text: str
    generated_tokens: int
    finish_reason: str
    tokens: list[TokenInfo] | None = None


class Generation(msgspec.Struct):
    """A finished prompt: its sequences, best first; `special` holds the special token ids."""

    sequences: list[Generated]
    input_length: int
    special: frozenset[int]
    prefill: list[TokenInfo] | None = None


class Piece(msgspec.Struct):
    """What one engine step added to a streamed prompt; the prompt's last piece has `final`."""

    text: str
    tokens: list[TokenInfo]
    special: frozenset[int]
    final: Generation | None = None


def named(error: GenerationError) -> str:
    """The error's message, naming its field when the message does not already."""
    if error.field and " - at `" not in error.message:
        return f"{error.message} - at `{error.field}`"
    return error.message


def top_tokens(token: TokenInfo, k: int) -> list[TopToken]:
    """The `k` most likely tokens at this position, the chosen one included if among them."""
    chosen = TopToken(token.token_id, token.text, token.logprob)
    return sorted((chosen, *token.alternatives), key=lambda t: -t.logprob)[:k]
