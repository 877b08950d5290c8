"""LMI `/invocations` (lmi-invocations.md): a payload decoded and checked into an
`LmiRequest`, no I/O: `SamplingOptions`, the output form, how many sequences to answer with,
each input's adapter; a payload the spec refuses raises `InvalidPayload` naming the JSON path
at fault. The wire shapes are protocols/lmi.py's.
"""

from __future__ import annotations

import msgspec

from protocols.constraints import (
    Constraint,
    constrained,
    guided,
    only_one,
    structured_outputs,
    tgi_grammar,
)
from protocols.errors import GenerationError, invalid, refuse, validation_error
from protocols.generation import (
    MAX_STOP_SEQUENCES,
    SamplingOptions,
    SequencesAsked,
    check_stop_count,
    sequences_asked,
)
from protocols.json_body import MALFORMED, decode_json_object
from protocols.lmi import (
    INFERENCE_COMPONENT,
    MEDIA_TYPES,
    LmiParameters,
    Output,
    check_parameter_types,
    payload_shape,
)
from protocols.transformers_fields import strip_ignored


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
    "typical_p": (None, 1.0),
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
        payload = payload_shape(doc)
    except msgspec.ValidationError as e:
        raise InvalidPayload(validation_error(e), dynamic) from e
    try:
        check_parameter_types(parameters)
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
        typical_p=p.typical_p or 1.0,
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
