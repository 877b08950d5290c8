"""The neutral vocabulary between wire protocols and the engine.

A protocol decodes its payload into `GenerationRequest`s (the options and the prompt); the
gateway answers each with events (protocols/events.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from protocols.errors import invalid
from protocols.events import History
from protocols.stop_strings import Holdback

# Constraints shared by the neutral options and every wire schema that sets them: every
# number a client gives is bounded here, so none reaches the engine past what it can carry
# (a 4xx naming the field, never a 500). JSON has no NaN or infinity, and a number past a
# double's range is read as an infinity (protocols/json_body.py), so every float has both
# bounds: they are its only check (tests/test_fuzz_*.py try every field past them).
MAX_TOKENS = 2**31 - 1  # more tokens than any context holds (a count past the room is cut to it)
# Sequences or beams per prompt (OpenAI's bound on `n`): the ceiling of the MAX_N, MAX_BEST_OF
# and MAX_NUM_BEAMS settings, which the engine path holds each field to.
MAX_SEQUENCES = 128
MAX_LENGTH_PENALTY = 10.0  # an exponent of a length: past it, a float overflows
# A seen token's logit divided (or multiplied, if negative) by it: 1 is none, 2 all but bans a
# repeat; peers give no upper bound, but past float32's range the engine's logits become
# infinite (and 0 x inf is NaN).
MAX_REPETITION_PENALTY = 10.0
MAX_STOP_SEQUENCES = 16  # stop strings per request: MAX_STOP_SEQUENCES' default
MaxNewTokens = Annotated[int, Meta(ge=1, le=MAX_TOKENS)]
Truncate = Annotated[int, Meta(ge=1, le=MAX_TOKENS)]  # the prompt's last tokens kept
Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]  # vLLM's own bounds
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
TopK = Annotated[int, Meta(ge=-1, le=2**31 - 1)]
RepetitionPenalty = Annotated[float, Meta(gt=0.0, le=MAX_REPETITION_PENALTY)]
NumBeams = Annotated[int, Meta(ge=1, le=MAX_SEQUENCES)]
MinTokens = Annotated[int, Meta(ge=0, le=MAX_TOKENS)]
MinP = Annotated[float, Meta(ge=0.0, le=1.0)]
TypicalP = Annotated[float, Meta(gt=0.0, le=1.0)]  # 1: off (transformers' default)
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
Count = Annotated[int, Meta(ge=1, le=MAX_SEQUENCES)]
Seed = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]  # an int64: what the engine carries
LengthPenalty = Annotated[float, Meta(ge=-MAX_LENGTH_PENALTY, le=MAX_LENGTH_PENALTY)]
MAX_TOKEN_ID = 2**31 - 1  # History keeps token ids as 32-bit ints
TokenId = Annotated[int, Meta(ge=0, le=MAX_TOKEN_ID)]
Priority = Annotated[int, Meta(ge=0, le=9)]  # a class, lower first (gateway/config/priorities.py)
LogprobCount = Annotated[int, Meta(ge=0, le=20)]
NonEmpty = Annotated[str, Meta(min_length=1)]


def check_stop_count(
    stop: Sequence[str | int], limit: int, field: str, what: str = "stop strings"
) -> None:
    """At most `limit` stop strings, or stop token ids (the MAX_STOP_SEQUENCES setting, where the
    protocol has no bound of its own), else a refusal naming `field`."""
    if len(stop) > limit:
        raise invalid(f"At most {limit} {what} are allowed, got {len(stop)} - at `{field}`", field)


SequenceField = Literal["n", "best_of", "num_beams"]


class SequencesAsked(msgspec.Struct, frozen=True):
    """A count of engine sequences that a request's own field asked for: `name` says which
    field it is (its bound: MAX_N, MAX_BEST_OF, MAX_NUM_BEAMS), `field` where the request gave
    it, as its protocol spells the path (`$.n`, `$.parameters.best_of`)."""

    name: SequenceField
    count: int
    field: str


def sequences_asked(
    path: str, *, n: int | None = None, best_of: int | None = None, num_beams: int | None = None
) -> tuple[SequencesAsked, ...]:
    """Each count given above 1, its field named under `path` (`$`, `$.parameters`)."""
    given: tuple[tuple[SequenceField, int | None], ...] = (
        ("n", n),
        ("best_of", best_of),
        ("num_beams", num_beams),
    )
    return tuple(
        SequencesAsked(name, count, f"{path}.{name}")
        for name, count in given
        if count is not None and count > 1
    )


class SamplingOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How to generate, independent of any wire protocol or engine."""

    max_new_tokens: MaxNewTokens = 100
    do_sample: bool = True
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    top_k: TopK = 50
    repetition_penalty: RepetitionPenalty = 1.0
    num_beams: NumBeams = 1
    length_penalty: LengthPenalty = 1.0
    early_stopping: bool | Literal["never"] = (
        False  # transformers' meaning (gateway/engine/beams.py)
    )
    seed: Seed | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    min_tokens: MinTokens = 0
    # Beyond the batch specs' generation_config: set by the protocols that expose them.
    min_p: MinP = 0.0
    typical_p: TypicalP = 1.0  # typical sampling (gateway/engine/typical_sampling.py)
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    n: Count = 1  # sequences to return (non-streaming)
    stop_token_ids: tuple[TokenId, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()
    # At most one constraint on the output (protocols/constraints.py, vLLM's structured outputs):
    json_schema: str | None = None  # the answer must be JSON valid against it (a JSON text)
    regex: str | None = None  # the answer must match it whole
    grammar: str | None = None  # an EBNF or Lark grammar the answer follows
    choice: tuple[str, ...] | None = None  # the answer is one of these
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
    tokens of the prompt. `prompt_field` is where errors about the prompt point. `asked`: the
    sequence counts (`n`, `best_of`, `num_beams`) the request's fields gave, each where it gave
    it, for the engine path to hold to their bounds and the caller's limit (empty: read from
    `options`, named as its fields are). `holdback`
    carries held-back text from one engine request of a generation to the next. `priority` is
    the class the request asked for, where its protocol has a field for it.
    `constraint_field` is where the request gave its output constraint (`options.json_schema`,
    `regex`, `grammar`, `choice`), as its protocol spells the path: a constraint the engine
    cannot compile is refused naming it. `adapter` names the LoRA adapter to generate with
    (None: the base model), `adapter_field` where the request named it. `tools`: the
    functions the chat template shows the model (OpenAI's `tools`), with `messages`.
    `left_out`: the sampling fields the request left out, for the served model's defaults
    (protocols/sampling_defaults.py; empty: none apply).
    """

    options: SamplingOptions
    prompt: str = ""
    messages: tuple[dict[str, Any], ...] | None = None
    tools: tuple[dict[str, Any], ...] | None = None
    history: History | None = None
    request_id: str | None = None
    index: int = 0
    stream: bool = True
    truncate: int | None = None
    prompt_field: str = "prompt"
    asked: tuple[SequencesAsked, ...] = ()
    holdback: Holdback | None = None
    priority: int | None = None
    constraint_field: str | None = None
    adapter: str | None = None
    adapter_field: str = "model"
    model_field: str = "model"  # where the request named its chat model
    left_out: frozenset[str] = frozenset()
