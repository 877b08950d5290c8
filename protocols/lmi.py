"""LMI `/invocations` (lmi-invocations.md): request decoding and answer encoding, no I/O.

A request becomes `SamplingOptions` and an output form; the engine's work comes back as
neutral events (protocols/generation.py), which `LmiEncoder` turns into the spec's JSON
documents, jsonlines or server-sent events.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, assert_never, get_type_hints

import msgspec
from msgspec import UNSET, Meta, UnsetType

from protocols.constraints import (
    Choices,
    Constraint,
    constrained,
    guided,
    only_one,
    structured_outputs,
    tgi_grammar,
)
from protocols.errors import ErrorKind, GenerationError, invalid, refuse, validation_error
from protocols.events import Finished, TokenInfo, TopToken, best_sequences, stop_cause, top_tokens
from protocols.generation import (
    MAX_STOP_SEQUENCES,
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
    SamplingOptions,
    Seed,
    SequencesAsked,
    Temperature,
    TokenId,
    TopK,
    TopP,
    Truncate,
    check_stop_count,
    sequences_asked,
)
from protocols.json_body import MALFORMED, decode_json_object
from protocols.sse import sse_event
from protocols.transformers_fields import strip_ignored

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


class LmiRequest(msgspec.Struct, frozen=True, kw_only=True):
    """`options.n` sequences are generated per prompt (beams, or best_of); the best
    `returned` are answered; `top_n` alternatives are reported per token. `asked`: the
    `n`, `best_of` and `num_beams` given, for their bounds."""

    inputs: list[str]
    dynamic: bool  # `inputs` was a list: the dynamic batch schema
    output: Output
    options: SamplingOptions
    asked: tuple[SequencesAsked, ...] = ()
    returned: int = 1
    top_n: int = 0
    truncate: int | None = None
    priority: int | None = None
    details: bool
    return_full_text: bool
    tgi_compat: bool
    constraint_field: str | None = None  # where the output constraint was given
    adapters: tuple[str | None, ...] = ()  # each input's adapter (empty: none for any)
    adapters_from: str = "$.adapters"  # where they were named: the field, or a header


class InvalidPayload(Exception):
    """A payload the spec answers with 424; `dynamic` picks the dynamic batch error body.

    `output` is set when the payload is valid but a generation parameter's value is not (out of
    its range, or a combination the engine cannot run): the spec answers "a bad generation
    parameter value" as a failed generation, in the request's output form.
    """

    def __init__(self, error: GenerationError, dynamic: bool, output: Output | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.dynamic = dynamic
        self.output = output


# Parameters beam search (gateway/engine/beams.py) does not apply, with the values that ask nothing.
_BEAM_NO_OPS: dict[str, tuple[object, ...]] = {
    "repetition_penalty": (None, 1.0),
    "presence_penalty": (None, 0.0),
    "frequency_penalty": (None, 0.0),
    "stop_sequences": (None, []),
    "stop_token_ids": (None, []),
    "logprobs": (None,),
    "prompt_logprobs": (None,),
    "decoder_input_details": (None, False),
    "spaces_between_special_tokens": (None, True),
}
_SAMPLING_NO_OPS: dict[str, tuple[object, ...]] = {
    "top_k": (None, 0, -1),
    "top_p": (None, 1.0),
    "min_p": (None, 0.0),
}


class _ChatProbe(msgspec.Struct):
    messages: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)


_CHAT_PROBE = msgspec.json.Decoder(_ChatProbe)


def is_chat(raw: bytes) -> bool:
    """DJL Serving's rule: a body that holds `messages` is a chat-completions request."""
    try:
        return bool(_CHAT_PROBE.decode(raw).messages)
    except MALFORMED:
        return False  # the LMI decoder names what is wrong


def output_form(stream: bool | None, formatter: str, tgi_compat: bool) -> Output:
    """As DJL: a set formatter wins; `stream` alone means jsonlines (SSE in TGI mode)."""
    if formatter in MEDIA_TYPES:
        return formatter
    if stream:
        return "sse" if tgi_compat else "jsonlines"
    return "json"


def decode_lmi(
    raw: bytes | str,
    *,
    formatter: str,
    tgi_compat: bool,
    max_new_tokens: int,
    max_stop: int = MAX_STOP_SEQUENCES,
) -> LmiRequest:
    """Decode and check a payload; raises InvalidPayload naming the JSON path at fault. At
    most `max_stop` stop sequences (MAX_STOP_SEQUENCES: LMI has no bound of its own)."""
    try:
        doc = decode_json_object(raw)
    except GenerationError as e:
        raise InvalidPayload(e, dynamic=False) from e
    dynamic = isinstance(doc.get("inputs"), list)
    strip_ignored(doc, "parameters", LmiParameters.__struct_fields__, "LMI parameters")
    parameters = doc.get("parameters")
    if parameters is None:
        parameters = {}
    try:  # the payload's shape first: its parameters' values are checked after
        payload = msgspec.convert({**doc, "parameters": None}, _Payload)
    except msgspec.ValidationError as e:
        raise InvalidPayload(validation_error(e), dynamic) from e
    try:
        msgspec.convert(parameters, _PARAMETER_TYPES)
    except msgspec.ValidationError as e:
        raise InvalidPayload(validation_error(e, "$.parameters"), dynamic) from e
    output = output_form(payload.stream, formatter, tgi_compat)
    streaming = output != "json"
    try:
        p = msgspec.convert(parameters, LmiParameters)
        details = p.details if p.details is not None else tgi_compat
        if dynamic and streaming and p.details:
            raise refuse("details", "details are not available when streaming a dynamic batch")
        check_stop_count(p.stop_sequences or (), max_stop, "$.parameters.stop_sequences")
        # vLLM looks for each generated token in this list, at every step: bounded as well.
        ids = p.stop_token_ids or ()
        check_stop_count(ids, max_stop, "$.parameters.stop_token_ids", "stop token ids")
        options, returned = lmi_options(
            p, streaming=streaming, details=details, max_new_tokens=max_new_tokens
        )
        constraint = lmi_constraint(p, tgi_compat=tgi_compat)
        options = constrained(options, constraint)
    except msgspec.ValidationError as e:
        raise InvalidPayload(validation_error(e, "$.parameters"), dynamic, output) from e
    except GenerationError as e:
        raise InvalidPayload(e, dynamic, output) from e
    inputs = payload.inputs if isinstance(payload.inputs, list) else [payload.inputs]
    adapters = _adapters(payload.adapters, len(inputs), dynamic)
    return LmiRequest(
        inputs=inputs,
        dynamic=dynamic,
        output=output,
        options=options,
        asked=sequences_asked("$.parameters", n=p.n, best_of=p.best_of, num_beams=p.num_beams),
        returned=returned,
        top_n=(p.logprobs or 0) if (p.num_beams or 1) == 1 else 0,
        truncate=p.truncate,
        priority=p.priority,
        details=details,
        return_full_text=bool(p.return_full_text),
        tgi_compat=tgi_compat,
        constraint_field=constraint.field if constraint is not None else None,
        adapters=adapters,
    )


def lmi_constraint(p: LmiParameters, *, tgi_compat: bool) -> Constraint | None:
    """The one output constraint the parameters give, if any; never with beam search."""
    path = "$.parameters"
    grammar = None
    if p.grammar is not None:
        if not tgi_compat:
            raise refuse(
                "grammar",
                "`grammar` is TGI's, taken under OPTION_TGI_COMPAT: send "
                "`structured_outputs` (vLLM's form)",
            )
        grammar = tgi_grammar(p.grammar, f"{path}.grammar")
    vllm = None
    if p.structured_outputs is not None:
        vllm = structured_outputs(p.structured_outputs, f"{path}.structured_outputs")
    legacy = guided(
        path,
        json=p.guided_json,
        regex=p.guided_regex,
        choice=p.guided_choice,
        grammar=p.guided_grammar,
    )
    constraint = only_one(vllm, legacy, grammar)
    if constraint is not None and (p.num_beams or 1) > 1:
        raise refuse("num_beams", f"num_beams > 1 cannot be used with `{constraint.field}`")
    return constraint


def _adapters(
    given: str | list[str | None] | None, inputs: int, dynamic: bool
) -> tuple[str | None, ...]:
    if given is None:
        return ()
    if isinstance(given, str):
        return (given,) * inputs
    if len(given) != inputs:
        error = invalid(
            f"`adapters` names {len(given)} adapters for {inputs} inputs: give one adapter "
            "for all inputs, or a list with one per input - at `$.adapters`",
            "$.adapters",
        )
        raise InvalidPayload(error, dynamic)
    return tuple(given)


def adapter_field(lmi: LmiRequest, index: int) -> str:
    """Where the request named input `index`'s adapter."""
    if lmi.adapters_from == "$.adapters" and lmi.dynamic and len(set(lmi.adapters)) > 1:
        return f"$.adapters[{index}]"
    return lmi.adapters_from


def with_component(lmi: LmiRequest, component: str | None) -> LmiRequest:
    """SageMaker's inference component (its header) as every input's adapter, where the
    payload names none."""
    if component is None or lmi.adapters:
        return lmi
    adapters = (component,) * len(lmi.inputs)
    return msgspec.structs.replace(lmi, adapters=adapters, adapters_from=INFERENCE_COMPONENT)


def _check_combinations(p: LmiParameters, *, streaming: bool) -> None:
    n, beams = p.n or 1, p.num_beams or 1
    best_of = p.best_of or n
    sampling = bool(p.do_sample) and p.temperature != 0
    for name, count in (("n", n), ("best_of", best_of), ("num_beams", beams)):
        if count > 1 and streaming:
            raise refuse(name, f"{name} > 1 only works without streaming")
    if best_of < n:
        raise refuse("best_of", f"best_of ({best_of}) must be at least n ({n})")
    if best_of > 1 and beams == 1 and not sampling:
        name = "n" if n > 1 else "best_of"
        raise refuse(name, f"{name} > 1 needs sampling: set do_sample true (temperature > 0)")
    if beams > 1:
        if (p.best_of or 1) > 1:
            raise refuse("best_of", "best_of cannot be combined with num_beams > 1")
        if n > beams:
            raise refuse("n", f"n ({n}) cannot exceed num_beams ({beams})")
        checked = {**_BEAM_NO_OPS, **(_SAMPLING_NO_OPS if p.do_sample else {})}
        for name, no_ops in checked.items():
            if getattr(p, name) not in no_ops:
                raise refuse(name, f"{name} cannot be used with beam search (num_beams > 1)")


def lmi_options(
    p: LmiParameters, *, streaming: bool, details: bool, max_new_tokens: int
) -> tuple[SamplingOptions, int]:
    """What to ask of the engine, and how many of its sequences to answer with."""
    _check_combinations(p, streaming=streaming)
    n, beams = p.n or 1, p.num_beams or 1
    best_of = p.best_of or n
    top_n = p.logprobs or 0
    # Token log-probabilities are shown in details and stream lines, and rank n / best_of.
    want_tokens = details or streaming or best_of > 1 or p.logprobs is not None
    prefill = bool(p.decoder_input_details) or p.prompt_logprobs is not None
    options = SamplingOptions(
        max_new_tokens=p.max_new_tokens or max_new_tokens,
        do_sample=bool(p.do_sample),
        temperature=1.0 if p.temperature is None else p.temperature,
        top_p=1.0 if p.top_p is None else p.top_p,
        top_k=0 if p.top_k is None else p.top_k,
        repetition_penalty=p.repetition_penalty or 1.0,
        num_beams=beams,
        length_penalty=1.0 if p.length_penalty is None else p.length_penalty,
        early_stopping=bool(p.early_stopping),
        seed=p.seed,
        stop=tuple(p.stop_sequences or ()),
        ignore_eos=bool(p.ignore_eos_token),
        min_p=p.min_p or 0.0,
        presence_penalty=p.presence_penalty or 0.0,
        frequency_penalty=p.frequency_penalty or 0.0,
        stop_token_ids=tuple(p.stop_token_ids or ()),
        include_stop_str_in_output=bool(p.include_stop_str_in_output),
        logprobs=top_n if want_tokens and beams == 1 else None,
        prompt_logprobs=(p.prompt_logprobs or 0) if prefill and beams == 1 else None,
        skip_special_tokens=p.skip_special_tokens is not False,
        spaces_between_special_tokens=p.spaces_between_special_tokens is not False,
        n=beams if beams > 1 else best_of,
    )
    return options, n if n > 1 else options.n  # n > 1: the best n; else every sequence (beam)


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


class LmiEncoder:
    """Writes one request's answers in its output form (built once per request)."""

    def __init__(self, request: LmiRequest) -> None:
        self.request = request
        self.media_type = MEDIA_TYPES[request.output]
        self._compat = request.tgi_compat
        self._top_n = request.top_n
        self._stop_ids = request.options.stop_token_ids

    def frame(self, data: bytes) -> bytes:
        return sse_event(data) if self.request.output == "sse" else data + b"\n"

    def token(self, info: TokenInfo | TopToken, top_n: int = 0) -> Token:
        top: list[Any] | UnsetType = UNSET
        if top_n and isinstance(info, TokenInfo):
            top = [self.token(t) for t in top_tokens(info, top_n)]
        if self._compat:
            return CompatToken(info.token_id, info.text, info.logprob, info.special, top)
        return LmiToken(info.token_id, info.text, info.logprob, info.special, top)

    def _tokens(self, infos: list[TokenInfo] | None) -> list[Any]:
        return [self.token(t, self._top_n) for t in infos or ()]

    def _prefill(self, finished: Finished) -> list[Any] | UnsetType:
        return UNSET if finished.prefill is None else [self.token(t) for t in finished.prefill]

    def answer(self, prompt: str, finished: Finished) -> Answer:
        request = self.request
        head = prompt if request.return_full_text else ""
        if request.options.num_beams > 1:  # ranked by the search's own score
            best, *others = finished.sequences[: request.returned]
        else:
            best, *others = best_sequences(finished, request.returned)
        if not request.details:
            return Answer(head + best.text)
        prefill = self._prefill(finished)
        details = Details(
            stop_cause(best.finish_reason, best.stop_reason, self._stop_ids),
            best.generated_tokens,
            prompt,
            self._tokens(best.tokens),
            prefill,
        )
        if others:
            details.best_of_sequences = [
                BestOfSequence(
                    stop_cause(s.finish_reason, s.stop_reason, self._stop_ids),
                    s.generated_tokens,
                    self._tokens(s.tokens),
                    head + s.text,
                    prefill,
                )
                for s in others
            ]
        return Answer(head + best.text, details)

    def document(self, answers: list[Answer]) -> bytes:
        """A rolling batch answer (a one-element list in TGI mode) or a dynamic batch's list."""
        if self.request.dynamic or self._compat:
            return _ENCODER.encode(answers)
        return _ENCODER.encode(answers[0])

    def lines(self, prompt: str, tokens: list[TokenInfo], final: Finished | None) -> bytes:
        """One line per token; the prompt's last line adds generated_text (and details)."""
        lines = [Line(self.token(t, self._top_n)) for t in tokens]
        if final is not None:
            if not lines:
                lines.append(Line())
            last = lines[-1]
            new = final.sequences[0]
            last.generated_text = (prompt if self.request.return_full_text else "") + new.text
            if self.request.details:
                reason = stop_cause(new.finish_reason, new.stop_reason, self._stop_ids)
                prefill = self._prefill(final)
                last.details = Details(reason, new.generated_tokens, prompt, prefill=prefill)
        return b"".join(self.frame(_ENCODER.encode(line)) for line in lines)

    def outputs(self, texts: list[str]) -> bytes:
        """A dynamic batch stream line: the new text of every prompt, in payload order."""
        return self.frame(_ENCODER.encode(Outputs(texts)))

    def failed_answer(self, message: str) -> bytes:
        return failed_answer(message, tgi_compat=self._compat)

    def failed_line(self, message: str) -> bytes:
        return failed_line(message, self.request.output, tgi_compat=self._compat)


def failed_answer(message: str, *, tgi_compat: bool) -> bytes:
    """The spec's answer to a rolling request whose generation failed (or could not start)."""
    answer = Answer("", Details("error", None, None, None, error_msg=message))
    return _ENCODER.encode([answer] if tgi_compat else answer)


def failed_line(message: str, output: Output, *, tgi_compat: bool) -> bytes:
    """The spec's last line of a stream whose generation failed (or could not start)."""
    details = Details("error", None, None)
    if tgi_compat:
        token: Token = CompatToken(-1, "", -1.0, True)
        line = Line(token, "", details, error=message, error_type="generation")
    else:
        line = Line(LmiToken(-1, "", -1.0, True, error_msg=message), "", details)
    data = _ENCODER.encode(line)
    return sse_event(data) if output == "sse" else data + b"\n"
