"""`SamplingOptions` as vLLM's `SamplingParams`."""

from __future__ import annotations

from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

from gateway.engine.engine_errors import refusal
from gateway.engine.typical_sampling import Filters
from protocols.generation import SamplingOptions


def sampling_params(
    options: SamplingOptions,
    kind: RequestOutputKind = RequestOutputKind.DELTA,
    *,
    keep_stop_strings: bool = False,
) -> SamplingParams:
    sample = options.do_sample and options.temperature > 0
    # vLLM has no typical sampling: a processor of the gateway's applies it with the other
    # filters in transformers' order (typical_sampling.py), vLLM's own then off.
    typical = sample and options.typical_p < 1.0
    own_filters = sample and not typical
    return SamplingParams(
        n=options.n,
        max_tokens=options.max_new_tokens,
        min_tokens=options.min_tokens,
        temperature=options.temperature if sample else 0.0,
        top_p=options.top_p if own_filters else 1.0,
        top_k=max(options.top_k, 0) if own_filters else 0,
        min_p=options.min_p if own_filters else 0.0,
        extra_args=_typical(options) if typical else None,
        repetition_penalty=options.repetition_penalty,
        presence_penalty=options.presence_penalty,
        frequency_penalty=options.frequency_penalty,
        seed=options.seed,
        stop=list(options.stop) or None,
        stop_token_ids=list(options.stop_token_ids) or None,
        logit_bias=dict(options.logit_bias) or None,
        structured_outputs=_structured(options),
        include_stop_str_in_output=options.include_stop_str_in_output or keep_stop_strings,
        ignore_eos=options.ignore_eos,
        logprobs=options.logprobs,
        prompt_logprobs=options.prompt_logprobs,
        skip_special_tokens=options.skip_special_tokens,
        spaces_between_special_tokens=options.spaces_between_special_tokens,
        output_kind=kind,
    )


def checked_params(
    options: SamplingOptions,
    kind: RequestOutputKind = RequestOutputKind.DELTA,
    *,
    keep_stop_strings: bool = False,
) -> SamplingParams:
    """vLLM checks the parameters as it builds them: a refusal there is the request's fault."""
    try:
        return sampling_params(options, kind, keep_stop_strings=keep_stop_strings)
    except VLLMValidationError as e:
        raise refusal(e) from e


def _typical(options: SamplingOptions) -> dict[str, object]:
    top_k = max(options.top_k, 0)
    return Filters(options.typical_p, top_k, options.top_p, options.min_p).extra_args()


def _structured(options: SamplingOptions) -> StructuredOutputsParams | None:
    if options.json_schema is not None:
        return StructuredOutputsParams(json=options.json_schema)
    if options.regex is not None:
        return StructuredOutputsParams(regex=options.regex)
    if options.grammar is not None:
        return StructuredOutputsParams(grammar=options.grammar)
    if options.choice is not None:
        return StructuredOutputsParams(choice=list(options.choice))
    return None
