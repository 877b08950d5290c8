"""WS `/generate` and POST `/v1/generate` (control-ws.md): messages and codecs.

Every message is a msgspec Struct tagged by `type`. Client messages decode as JSON, lose the
transformers GenerationConfig fields their `parameters` do not honour
(protocols/transformers_fields.py), then convert to `ClientMessage`; a bad message's error
names its JSON path. Unknown fields are ignored, except in `parameters` (and beside the
prompt of a `/v1/generate` body, where the parameters are too).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, assert_never

import msgspec
from msgspec import UNSET, Meta, UnsetType

from protocols.errors import ErrorKind, GenerationError, invalid, refuse, validation_error
from protocols.generation import (
    MAX_STOP_SEQUENCES,
    MAX_TOKENS,
    MaxNewTokens,
    RepetitionPenalty,
    SamplingOptions,
    Seed,
    Temperature,
    TopK,
    TopP,
    check_stop_count,
)
from protocols.json_body import JSON_DECODER, MALFORMED, malformed
from protocols.transformers_fields import strip_ignored, without_ignored

Rating = Annotated[float, Meta(ge=-1.0, le=1.0)]
LOGPROB_ALTERNATIVES = 5  # alternatives sent with each token when include_logprobs is set


class Parameters(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    max_tokens: MaxNewTokens | UnsetType = UNSET
    temperature: Temperature | UnsetType = UNSET
    top_p: TopP | UnsetType = UNSET
    top_k: TopK | UnsetType = UNSET
    repetition_penalty: RepetitionPenalty | UnsetType = UNSET
    stop: list[str] | UnsetType = UNSET
    seed: Seed | UnsetType | None = UNSET
    ignore_eos: bool | UnsetType = UNSET


class RestOptions(msgspec.Struct, kw_only=True):
    echo_prompt: bool = False
    include_token_ids: bool = False
    include_logprobs: bool = False
    include_timing: bool = False


class Options(RestOptions, kw_only=True):
    stream: bool = True


_PARAMETERS = Parameters.__struct_fields__

# --- client -> server ----------------------------------------------------------------------


class _ClientMessage(msgspec.Struct, tag_field="type", kw_only=True):
    """A message from the client, tagged by `type`."""


class ChatMessage(msgspec.Struct):
    """An extension: a conversation, rendered with the served model's chat template."""

    role: Literal["system", "user", "assistant"]
    content: str


Messages = Annotated[list[ChatMessage], Meta(min_length=1)]


class Config(_ClientMessage, tag="config"):
    prompt: str | UnsetType = UNSET
    messages: Messages | UnsetType = UNSET
    model: str | None = None
    parameters: Parameters = msgspec.field(default_factory=Parameters)
    options: Options = msgspec.field(default_factory=Options)


Action = Literal["stop", "pause", "resume", "regenerate", "modify"]


class Control(_ClientMessage, tag="control"):
    action: Action
    parameters: Parameters | None = None


class Feedback(_ClientMessage, tag="feedback"):
    rating: Rating
    text: str | None = None
    position: Annotated[int, Meta(ge=0, le=MAX_TOKENS)] | None = None


class Reattach(_ClientMessage, tag="reattach"):
    """An extension (docs/CONTROL.md, "Reattaching"): a client whose connection dropped takes
    its generation back, with the token messages after the first `received` it already has."""

    request_id: str
    received: Annotated[int, Meta(ge=0)] = 0


ClientMessage = Config | Control | Feedback | Reattach

# --- server -> client ----------------------------------------------------------------------


class Status(msgspec.Struct, tag="status", tag_field="type"):
    operation: str
    progress: float
    message: str
    eta_seconds: float | None  # null when there is nothing to estimate from yet


class ModelInfo(msgspec.Struct, omit_defaults=True):
    max_tokens: int
    version: str | UnsetType = UNSET
    quantization: str | UnsetType = UNSET


class Init(msgspec.Struct, tag="init", tag_field="type", omit_defaults=True):
    request_id: str
    model: str
    model_info: ModelInfo | UnsetType = UNSET


class LogprobEntry(msgspec.Struct):
    token: str
    logprob: float


class TokenTiming(msgspec.Struct):
    token_ms: float
    total_ms: float


class Token(msgspec.Struct, tag="token", tag_field="type", omit_defaults=True):
    token: str
    generated_text: str
    finish_reason: str | None
    finished: bool
    token_id: int | UnsetType = UNSET
    token_ids: list[int] | UnsetType = UNSET  # only when one message carries several tokens
    logprobs: list[LogprobEntry] | UnsetType = UNSET
    timing: TokenTiming | UnsetType = UNSET


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionTiming(msgspec.Struct):
    first_token_ms: float | None
    total_ms: float


class Completion(msgspec.Struct, tag="completion", tag_field="type", omit_defaults=True):
    generated_text: str
    finish_reason: str
    usage: Usage
    request_id: str | None = None
    timing: CompletionTiming | UnsetType = UNSET


class Error(msgspec.Struct, tag="error", tag_field="type", omit_defaults=True):
    error: str
    message: str
    recoverable: bool
    recovery_action: str
    request_id: str | UnsetType = UNSET
    field: str | UnsetType = UNSET


ServerMessage = Status | Init | Token | Completion | Error

_SERVER_DECODER: msgspec.json.Decoder[ServerMessage] = msgspec.json.Decoder(ServerMessage)
_ENCODER = msgspec.json.Encoder()

# Finish reasons: the engine's "length" and "stop" (EOS, a stop token or a stop string), and
# CANCELLED for a client's `stop` control.
CANCELLED = "cancelled"


def _shape(kind: ErrorKind) -> tuple[str, bool, str]:
    """The spec's (error type, recoverable, recovery_action) for a kind."""
    match kind:
        case ErrorKind.INVALID_REQUEST | ErrorKind.UNPROCESSABLE | ErrorKind.DUPLICATE_REQUEST_ID:
            return "invalid_request", True, "fix_request"
        case ErrorKind.CONTEXT_LENGTH_EXCEEDED:
            return "context_length_exceeded", True, "shorten_prompt"
        case ErrorKind.RATE_LIMITED:
            return "rate_limited", True, "retry"
        case ErrorKind.UNAUTHORIZED:
            return "unauthorized", False, "none"
        case ErrorKind.ENGINE_ERROR:
            return "internal_error", True, "retry"
        case ErrorKind.ENGINE_UNAVAILABLE:
            return "model_loading_error", False, "none"
        case _:
            assert_never(kind)


def kind_of(error: Error) -> ErrorKind:
    """The neutral kind behind an error message (for an HTTP status)."""
    return next((k for k in ErrorKind if _shape(k)[0] == error.error), ErrorKind.ENGINE_ERROR)


def check_prompt(config: Config) -> None:
    """A config names its prompt one way: `prompt` or `messages`, not both, not neither."""
    if (config.prompt is UNSET) == (config.messages is UNSET):
        given = "both" if config.prompt is not UNSET else "neither"
        raise invalid(
            f"A config needs exactly one of `prompt` and `messages`, not {given}", "$.prompt"
        )


def decode_client(raw: bytes | str) -> ClientMessage:
    try:
        doc: Any = JSON_DECODER.decode(raw)
        if isinstance(doc, dict):
            strip_ignored(doc, "parameters", _PARAMETERS, "control parameters")
        message: ClientMessage = msgspec.convert(doc, ClientMessage)
        return message
    except msgspec.ValidationError as e:
        raise validation_error(e) from e
    except MALFORMED as e:
        raise malformed(e, raw) from e


def type_of(raw: bytes | str) -> str | None:
    """The `type` a client message says it is, read however wrong the rest of it is (None for
    one that is not a JSON object with a string `type`)."""
    try:
        doc: Any = JSON_DECODER.decode(raw)
    except MALFORMED:
        return None
    kind = doc.get("type") if isinstance(doc, dict) else None
    return kind if isinstance(kind, str) else None


def decode_server(raw: bytes | str) -> ServerMessage:
    """The client's side of the codec, for tests and Python clients."""
    return _SERVER_DECODER.decode(raw)


def encode(message: ServerMessage) -> bytes:
    return _ENCODER.encode(message)


def error_message(
    error: GenerationError,
    request_id: str | None = None,
    *,
    recoverable: bool | None = None,
    recovery_action: str | None = None,
) -> Error:
    kind, default_recoverable, default_action = _shape(error.kind)
    return Error(
        kind,
        error.message,
        default_recoverable if recoverable is None else recoverable,
        recovery_action or default_action,
        UNSET if request_id is None else request_id,
        UNSET if error.field is None else error.field,
    )


def apply_parameters(
    options: SamplingOptions, parameters: Parameters, max_stop: int = MAX_STOP_SEQUENCES
) -> SamplingOptions:
    """`parameters` over `options`: only the fields that are given change; at most
    `max_stop` stop strings (MAX_STOP_SEQUENCES)."""
    given: dict[str, object] = {}
    if parameters.max_tokens is not UNSET:
        given["max_new_tokens"] = parameters.max_tokens
    for name in ("temperature", "top_p", "top_k", "repetition_penalty", "seed", "ignore_eos"):
        value = getattr(parameters, name)
        if value is not UNSET:
            given[name] = value
    if parameters.stop is not UNSET:
        if any(s == "" for s in parameters.stop):
            raise refuse("stop", "Stop strings must not be empty")
        check_stop_count(parameters.stop, max_stop, "$.parameters.stop")
        given["stop"] = tuple(parameters.stop)
    if "temperature" in given:
        given["do_sample"] = given["temperature"] != 0
    return msgspec.structs.replace(options, **given)


# --- POST /v1/generate ---------------------------------------------------------------------


class RestRequest(Parameters, forbid_unknown_fields=True, kw_only=True):
    """The spec's REST body: the config's parameters flat beside the prompt (or nested in
    `parameters`, as in a WebSocket `config`; a flat one wins over the same nested one).
    The parameters being flat, an unknown field beside the prompt is refused as one in
    `parameters` is (transformers' GenerationConfig names are ignored and logged); `type`
    lets a WebSocket `config` be posted as it is. `options` ignores unknown fields, as a
    WebSocket message's do."""

    type: Literal["config"] | UnsetType = UNSET
    prompt: str | UnsetType = UNSET
    messages: Messages | UnsetType = UNSET
    model: str | None = None
    stream: bool = False
    parameters: Parameters = msgspec.field(default_factory=Parameters)
    options: RestOptions = msgspec.field(default_factory=RestOptions)


class RestResponse(msgspec.Struct, omit_defaults=True):
    id: str
    model: str
    generated_text: str
    finish_reason: str
    usage: Usage
    timing: CompletionTiming | UnsetType = UNSET


def rest_config(raw: bytes, max_stop: int = MAX_STOP_SEQUENCES) -> Config:
    try:
        doc: Any = JSON_DECODER.decode(raw)
        if isinstance(doc, dict):
            doc = without_ignored(doc, _PARAMETERS, "/v1/generate")
            strip_ignored(doc, "parameters", _PARAMETERS, "/v1/generate parameters")
        body = msgspec.convert(doc, RestRequest)
    except msgspec.ValidationError as e:
        raise validation_error(e) from e
    except MALFORMED as e:
        raise malformed(e, raw) from e
    for stop, field in ((body.stop, "$.stop"), (body.parameters.stop, "$.parameters.stop")):
        if stop is not UNSET:
            check_stop_count(stop, max_stop, field)
    given = {name: getattr(body, name) for name in Parameters.__struct_fields__}
    nested = msgspec.structs.asdict(body.parameters)
    parameters = Parameters(**{k: v if v is not UNSET else nested[k] for k, v in given.items()})
    options = Options(stream=body.stream, **msgspec.structs.asdict(body.options))
    return Config(
        prompt=body.prompt,
        messages=body.messages,
        model=body.model,
        parameters=parameters,
        options=options,
    )


def rest_response(request_id: str, model: str, completion: Completion) -> RestResponse:
    text, reason, usage = completion.generated_text, completion.finish_reason, completion.usage
    return RestResponse(request_id, model, text, reason, usage, completion.timing)
