"""Beam search as Hugging Face transformers' `generate(num_beams=...)` does it, over any engine.

`num_beams`, `length_penalty` and `early_stopping` are transformers' GenerationConfig names,
so transformers' own beam search (transformers 5.x `_beam_search`) is the reference, step for
step: each step keeps the best `2 x num_beams` continuations of all running beams; one that
ends (an end-of-sequence token, or the last allowed token) becomes a finished hypothesis if it
ranks among the first `num_beams`, scored by its log-probability over its generated length
(the ending token included) to the power `length_penalty`; the best `num_beams` of the others
run on. The search ends when no running beam can beat the worst finished hypothesis (the
heuristic transformers applies for `early_stopping=False`; "never" bounds it by the longest
possible length), as soon as `num_beams` hypotheses are finished (`early_stopping=True`), or
at the length limit. vLLM's own beam search differs: it normalises over the prompt too and
keeps every ending candidate, so a beam that ends at once can win with an empty text.

The engine is reached through `next_tokens`: for each sequence, the log-probabilities of its
most likely next tokens. Each hypothesis keeps its tokens' own log-probabilities (the model's,
not divided by the temperature), which the answers report per token.
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal, NamedTuple

NextTokens = Callable[[list[list[int]], int], Awaitable[list[dict[int, float]]]]
EarlyStopping = bool | Literal["never"]


class Hypothesis(NamedTuple):
    score: float  # sum of log-probabilities / generated length ** length_penalty
    token_ids: tuple[int, ...]
    ended_at_eos: bool
    logprobs: tuple[float, ...] = ()  # each token's, as the model scored it


class _Beam(NamedTuple):
    logprob: float
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]


class _Candidate(NamedTuple):
    rank_key: float  # the log-probability, with Gumbel noise when sampling
    logprob: float
    token_ids: tuple[int, ...]
    ends_at_eos: bool
    logprobs: tuple[float, ...]


async def beam_search(
    prompt: Sequence[int],
    next_tokens: NextTokens,
    *,
    num_beams: int,
    max_new_tokens: int,
    eos_token_ids: frozenset[int],
    length_penalty: float = 1.0,
    early_stopping: EarlyStopping = False,
    temperature: float | None = None,
    seed: int | None = None,
) -> list[Hypothesis]:
    """The `num_beams` finished hypotheses, best first. `temperature` set: beam sampling (the
    candidates are drawn, without replacement, in proportion to their probability)."""
    keep = max(2, 1 + len(eos_token_ids)) * num_beams
    sampler = random.Random(seed)
    running = [_Beam(0.0, (), ())]
    finished: list[Hypothesis] = []
    can_improve = True
    for length in range(1, max_new_tokens + 1):
        scores = await next_tokens([[*prompt, *beam.token_ids] for beam in running], keep)
        candidates = []
        for beam, scored in zip(running, scores, strict=True):
            for token_id, logprob in scored.items():
                total = beam.logprob + (logprob if temperature is None else logprob / temperature)
                key = total if temperature is None else total + _gumbel(sampler)
                ended = token_id in eos_token_ids
                ids, logprobs = (*beam.token_ids, token_id), (*beam.logprobs, logprob)
                candidates.append(_Candidate(key, total, ids, ended, logprobs))
        candidates = sorted(candidates, key=lambda c: -c.rank_key)[:keep]
        last = length == max_new_tokens
        full = len(finished) == num_beams
        if can_improve and not (full and early_stopping is True):
            finished += [
                Hypothesis(
                    c.logprob / length**length_penalty, c.token_ids, c.ends_at_eos, c.logprobs
                )
                for c in candidates[:num_beams]
                if c.ends_at_eos or last
            ]
            finished = sorted(finished, key=lambda h: -h.score)[:num_beams]
        running = sorted(
            (
                _Beam(c.logprob, c.token_ids, c.logprobs)
                for c in candidates
                if not (c.ends_at_eos or last)
            ),
            key=lambda b: -b.logprob,
        )[:num_beams]
        if not running:
            break
        best_length = max_new_tokens if early_stopping == "never" and length_penalty > 0 else length
        worst = finished[-1].score if len(finished) == num_beams else -math.inf
        can_improve = can_improve and running[0].logprob / best_length**length_penalty > worst
        if not can_improve or (len(finished) == num_beams and early_stopping is True):
            break
    return finished


def _gumbel(sampler: random.Random) -> float:
    return -math.log(-math.log(sampler.random() or 1e-300))
