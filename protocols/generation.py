"""The neutral vocabulary between wire protocols and the engine.

A protocol decodes its payload into `PromptItem`s and one `SamplingOptions`; the gateway
answers with a stream of event lists. Each list holds what happened in one engine step, at
most one event of each type per prompt, in the order a client should see them.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from protocols.errors import ErrorKind

# Constraints shared by the neutral options and every wire schema that sets them.
MaxNewTokens = Annotated[int, Meta(ge=1)]
Temperature = Annotated[float, Meta(ge=0.0)]
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
TopK = Annotated[int, Meta(ge=-1)]
RepetitionPenalty = Annotated[float, Meta(gt=0.0)]
NumBeams = Annotated[int, Meta(ge=1)]
MinTokens = Annotated[int, Meta(ge=0)]
MinP = Annotated[float, Meta(ge=0.0, le=1.0)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
Count = Annotated[int, Meta(ge=1)]
LogprobCount = Annotated[int, Meta(ge=0, le=20)]
NonEmpty = Annotated[str, Meta(min_length=1)]


class SamplingOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How to generate, independent of any wire protocol or engine."""

    max_new_tokens: MaxNewTokens = 100
    do_sample: bool = True
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    top_k: TopK = 50
    repetition_penalty: RepetitionPenalty = 1.0
    num_beams: NumBeams = 1
    length_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    min_tokens: MinTokens = 0
    # Beyond the batch specs' generation_config: set by the protocols that expose them.
    min_p: MinP = 0.0
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    n: Count = 1  # sequences to return (non-streaming)
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    logprobs: LogprobCount | None = None  # alternatives per generated token; 0: the chosen only
    prompt_logprobs: LogprobCount | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True


class TopToken(msgspec.Struct, frozen=True):
    token_id: int
    text: str
    logprob: float


class TokenInfo(msgspec.Struct, frozen=True):
    """One token with the engine's log-probability, and its best alternatives when asked."""

    token_id: int
    text: str
    logprob: float
    alternatives: tuple[TopToken, ...] = ()


class PromptItem(msgspec.Struct, frozen=True):
    request_id: str
    prompt: str


class Started(msgspec.Struct, frozen=True):
    """The prompt left the gateway's queue and was handed to the engine."""

    index: int


class Initialized(msgspec.Struct, frozen=True):
    """The engine finished the prompt's prefill; `prompt_text` is the whole sequence so far."""

    index: int
    prompt_text: str


class Delta(msgspec.Struct):
    """New text since the last event of this prompt (several engine outputs may be merged)."""

    index: int
    text: str


class Finished(msgspec.Struct, frozen=True):
    index: int
    new_text: str
    full_text: str
    new_tokens: int
    is_eos: bool
    finish_reason: str
    execution_time: float
    cached_prompt_tokens: int


class Failed(msgspec.Struct, frozen=True):
    """`field` is relative to the prompt's entry (e.g. "prompt"), or None."""

    index: int
    kind: ErrorKind
    message: str
    field: str | None = None


Event = Started | Initialized | Delta | Finished | Failed
