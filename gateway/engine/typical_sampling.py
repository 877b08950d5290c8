"""Typical sampling (`typical_p`: TGI's, LMI's and transformers' GenerationConfig's), which vLLM
does not have, as a vLLM logits processor (its public `LogitsProcessor` API, named in the engine
arguments and loaded in the worker).

A request that asks for it carries its filters in `SamplingParams.extra_args[TYPICAL]`, and
vLLM's own top-k, top-p and min-p are off for it (gateway/engine/sampling.py): this processor
applies all four in transformers' order (top-k, top-p, min-p, typical; TGI's is the same), after
the temperature, to the rows of the requests that sample. vLLM calls it for sampled rows only
(`is_argmax_invariant`): greedy requests never see it, as transformers applies its warpers only
when sampling.

TYPICAL_SAMPLING (auto) loads it on a CPU only: with any custom logits processor vLLM keeps
every request's output tokens for it, and under a GPU's asynchronous scheduling it then waits,
each step, for the previous step's tokens to reach the host before sampling: a cost for every
request, not measured here (no GPU). Without it, typical_p is ignored and logged, as any
GenerationConfig field the engine cannot honour.
"""

from __future__ import annotations

from typing import Any

import msgspec
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

TYPICAL = "gateway_typical_sampling"  # the key in SamplingParams.extra_args
# By name: vLLM loads it in the worker (engine_args.py).
TYPICAL_SAMPLING = "gateway.engine.typical_sampling:TypicalSampling"


class Filters(msgspec.Struct, frozen=True):
    """One request's filters, each off at its neutral value."""

    typical_p: float
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def extra_args(self) -> dict[str, Any]:
        return {TYPICAL: msgspec.to_builtins(self)}


def _filters_of(
    params: SamplingParams, _prompt: list[int] | None, _out: list[int]
) -> Filters | None:
    given = (params.extra_args or {}).get(TYPICAL)
    return None if given is None else msgspec.convert(given, Filters)


class TypicalSampling(LogitsProcessor):
    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self._rows: dict[int, Filters] = {}

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self._rows, batch_update, _filters_of)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, filters in self._rows.items():
            logits[index] = filtered(logits[index : index + 1], filters)[0]
        return logits


def filtered(scores: torch.Tensor, filters: Filters) -> torch.Tensor:
    """`scores` (one row) less the tokens the filters remove, as transformers' TopK, TopP, MinP
    and Typical logits warpers remove them (each keeping at least one token)."""
    removed = float("-inf")
    vocabulary = scores.shape[-1]
    if filters.top_k > 0:
        kth = torch.topk(scores, min(filters.top_k, vocabulary))[0][..., -1, None]
        scores = scores.masked_fill(scores < kth, removed)
    if filters.top_p < 1.0:
        ascending, order = torch.sort(scores, descending=False)
        below = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - filters.top_p
        below[..., -1:] = False
        scores = scores.masked_fill(below.scatter(1, order, below), removed)
    if filters.min_p > 0.0:
        probs = scores.softmax(dim=-1)
        least = probs.amax(dim=-1, keepdim=True) * filters.min_p
        scores = scores.masked_fill(probs < least, removed)
    return _typical(scores, filters.typical_p)


def _typical(scores: torch.Tensor, mass: float) -> torch.Tensor:
    """transformers' TypicalLogitsWarper: the tokens whose information is closest to the
    distribution's entropy, until they hold `mass` of the probability."""
    normalized = torch.nn.functional.log_softmax(scores, dim=-1)
    probs = torch.exp(normalized)
    entropy = -(normalized * probs).nansum(-1, keepdim=True)
    shifted = torch.abs(-normalized - entropy)
    sorted_scores, order = torch.sort(shifted, descending=False)
    cumulative = scores.gather(-1, order).softmax(dim=-1).cumsum(dim=-1)
    last = (cumulative < mass).sum(dim=1).clamp_(max=scores.shape[-1] - 1)
    beyond = sorted_scores > sorted_scores.gather(1, last.view(-1, 1))
    beyond[..., :1] = False
    return scores.masked_fill(beyond.scatter(1, order, beyond), float("-inf"))
