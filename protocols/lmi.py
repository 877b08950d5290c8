"""LMI `/invocations` (lmi-invocations.md): its wire shapes, no I/O. The payload and its
parameters, the answers, stream lines and error bodies as the spec writes them, and the status
of each failure; the schemas of /openapi.json are these Structs.

Decoding a payload is protocols/lmi_requests.py; writing the engine's events in these shapes
is protocols/lmi_answers.py.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, assert_never, get_type_hints

import msgspec
from msgspec import UNSET, Meta, UnsetType

from protocols.constraints import Choices
from protocols.errors import ErrorKind
from protocols.generation import (
    Count,
    LengthPenalty,
    LogprobCount,
    MaxNewTokens,
    MinP,
    NonEmpty,
    NumBeams,
    Penalty,
    Priority,
    RepetitionPenalty,
    Seed,
    Temperature,
    TokenId,
    TopK,
    TopP,
    Truncate,
    TypicalP,
)

Output = Literal["json", "jsonlines", "sse"]
MEDIA_TYPES: dict[Output, str] = {
    "json": "application/json",
    "jsonlines": "application/jsonlines",
    "sse": "text/event-stream",
}

# SageMaker names an endpoint's inference component (boto3: InferenceComponentName) here: the
# gateway serves each LoRA adapter as one (docs/ADAPTERS.md).
INFERENCE_COMPONENT = "X-Amzn-SageMaker-Inference-Component"


# --- Request ------------------------------------------------------------------------------------


class LmiParameters(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The spec's common and vLLM parameters; null or absent means the spec's default."""

    do_sample: bool | None = None
    seed: Seed | None = None
    temperature: Temperature | None = None
    repetition_penalty: RepetitionPenalty | None = None
    top_k: TopK | None = None
    top_p: TopP | None = None
    max_new_tokens: MaxNewTokens | None = None
    details: bool | None = None
    return_full_text: bool | None = None
    stop_sequences: list[NonEmpty] | None = None
    decoder_input_details: bool | None = None
    min_p: MinP | None = None
    typical_p: TypicalP | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    n: Count | None = None
    best_of: Count | None = None
    num_beams: NumBeams | None = None
    length_penalty: LengthPenalty | None = None
    early_stopping: bool | None = None
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool | None = None
    ignore_eos_token: bool | None = None
    logprobs: LogprobCount | None = None
    prompt_logprobs: LogprobCount | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    truncate: Truncate | None = None
    priority: Priority | None = None  # the gateway's: a class at or behind the route's
    # Output constraints (protocols/constraints.py): vLLM's, which LMI passes through to it
    # (`structured_outputs`; `guided_*` before vLLM 0.12), and TGI's under OPTION_TGI_COMPAT.
    structured_outputs: dict[str, Any] | None = None
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: Choices | None = None
    guided_grammar: str | None = None
    grammar: Any = None


# The parameters' shape without their ranges: a payload that fits it is valid, and a value
# out of range is the spec's "bad generation parameter value" (get_type_hints drops the Meta).
_PARAMETER_TYPES = msgspec.defstruct(
    "LmiParameterTypes",
    [(name, hint, None) for name, hint in get_type_hints(LmiParameters).items()],
    forbid_unknown_fields=True,
    kw_only=True,
)


class _Payload(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    inputs: NonEmpty | Annotated[list[NonEmpty], Meta(min_length=1)]
    parameters: LmiParameters | None = None
    # LMI's LoRA adapter by name: one for every input, or a list with one per input.
    adapters: NonEmpty | list[NonEmpty | None] | None = None
    stream: bool | None = None


def payload_shape(doc: dict[str, Any]) -> _Payload:
    """The payload's shape, its parameters left out (their values are checked after); raises
    msgspec.ValidationError."""
    return msgspec.convert({**doc, "parameters": None}, _Payload)


def check_parameter_types(parameters: Any) -> None:
    """Raises msgspec.ValidationError unless the parameters fit their shape (ranges aside)."""
    msgspec.convert(parameters, _PARAMETER_TYPES)


# --- Answers ------------------------------------------------------------------------------------


class LmiToken(msgspec.Struct, omit_defaults=True):
    id: int
    text: str
    log_prob: float | None  # NaN (no value) is written as null
    special_token: bool = False
    top_tokens: list[LmiToken] | UnsetType = UNSET
    error_msg: str | UnsetType = UNSET


class CompatToken(msgspec.Struct, omit_defaults=True):
    """A token under OPTION_TGI_COMPAT: TGI's field names."""

    id: int
    text: str
    logprob: float | None
    special: bool
    top_tokens: list[CompatToken] | UnsetType = UNSET


Token = LmiToken | CompatToken


class BestOfSequence(msgspec.Struct, omit_defaults=True):
    finish_reason: str
    generated_tokens: int
    tokens: list[Any]
    generated_text: str
    prefill: list[Any] | UnsetType = UNSET


class Details(msgspec.Struct, omit_defaults=True):
    finish_reason: str
    generated_tokens: int | None
    inputs: str | None
    tokens: list[Any] | UnsetType | None = UNSET
    prefill: list[Any] | UnsetType = UNSET
    best_of_sequences: list[BestOfSequence] | UnsetType = UNSET
    error_msg: str | UnsetType = UNSET


class Answer(msgspec.Struct, omit_defaults=True):
    generated_text: str
    details: Details | UnsetType = UNSET


class Line(msgspec.Struct, omit_defaults=True):
    token: Any = UNSET
    generated_text: str | UnsetType = UNSET
    details: Details | UnsetType = UNSET
    # Under OPTION_TGI_COMPAT a failed stream also says so the way TGI clients read it.
    error: str | UnsetType = UNSET
    error_type: str | UnsetType = UNSET


class Outputs(msgspec.Struct):
    outputs: list[str]


class PayloadError(msgspec.Struct):
    error: str
    code: int


class HandlerFailure(msgspec.Struct):
    code: int
    message: str
    error: str


_ENCODER = msgspec.json.Encoder()


def lmi_status(kind: ErrorKind) -> int:
    """The status of a failure before any output: the spec's 424, or overload and loading."""
    match kind:
        case (
            ErrorKind.INVALID_REQUEST
            | ErrorKind.UNPROCESSABLE
            | ErrorKind.CONTEXT_LENGTH_EXCEEDED
            | ErrorKind.DUPLICATE_REQUEST_ID
            | ErrorKind.ENGINE_ERROR
        ):
            return 424
        case ErrorKind.RATE_LIMITED:
            return 429
        case ErrorKind.UNAUTHORIZED:
            return 401
        case ErrorKind.ENGINE_UNAVAILABLE:
            return 503
        case _:
            assert_never(kind)


def payload_error(message: str, code: int, *, dynamic: bool) -> bytes:
    """The spec's error bodies: {"error", "code"}, or the dynamic batch handler failure."""
    if dynamic:
        return _ENCODER.encode(HandlerFailure(code, "invoke handler failure", message))
    return _ENCODER.encode(PayloadError(message, code))
