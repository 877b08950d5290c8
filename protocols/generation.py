"""The neutral vocabulary between wire protocols and the engine.

A protocol decodes its payload into `GenerationRequest`s (the options and the prompt); the
gateway answers each with events (protocols/events.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from protocols.events import History
from protocols.holdback import Holdback

# Constraints shared by the neutral options and every wire schema that sets them.
MaxNewTokens = Annotated[int, Meta(ge=1)]
Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]  # vLLM's own bounds
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
TopK = Annotated[int, Meta(ge=-1, le=2**31 - 1)]
RepetitionPenalty = Annotated[float, Meta(gt=0.0)]
NumBeams = Annotated[int, Meta(ge=1)]
MinTokens = Annotated[int, Meta(ge=0)]
MinP = Annotated[float, Meta(ge=0.0, le=1.0)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
Count = Annotated[int, Meta(ge=1)]
Priority = Annotated[int, Meta(ge=0, le=9)]  # a class, lower first (gateway/config/priorities.py)
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
    early_stopping: bool | Literal["never"] = (
        False  # transformers' meaning (gateway/engine/beams.py)
    )
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
    logit_bias: tuple[tuple[int, float], ...] = ()
    json_schema: str | None = None  # the answer must be JSON valid against it (a JSON text)
    include_stop_str_in_output: bool = False
    logprobs: LogprobCount | None = None  # alternatives per generated token; 0: the chosen only
    prompt_logprobs: LogprobCount | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True


class PromptItem(msgspec.Struct, frozen=True):
    request_id: str
    prompt: str


class GenerationRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One prompt, as any protocol asks for it.

    The prompt is `history` (continued, its `prompt` ignored), else `messages` rendered with the
    model's chat template, else `prompt`. `request_id`, when set, may not run twice at once.
    `stream`: report each step as a Delta; else only the end. `truncate` keeps the last
    tokens of the prompt. `prompt_field` is where errors about the prompt point. `holdback`
    carries held-back text from one engine request of a generation to the next. `priority` is
    the class the request asked for, where its protocol has a field for it.
    """

    options: SamplingOptions
    prompt: str = ""
    messages: tuple[dict[str, Any], ...] | None = None
    history: History | None = None
    request_id: str | None = None
    index: int = 0
    stream: bool = True
    truncate: int | None = None
    prompt_field: str = "prompt"
    holdback: Holdback | None = None
    priority: int | None = None
