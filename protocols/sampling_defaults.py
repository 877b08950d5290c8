"""A served model's sampling defaults (SAMPLING_DEFAULTS): what a request of the OpenAI and
Anthropic routes (chat, completions, Responses, Messages) samples with for a field it leaves
out, in place of the API's own default (temperature 1, no top-p, top-k or min-p), as vLLM's
server takes its `--override-generation-config`. A small model sampled over its whole
vocabulary at temperature 1 rarely ends its turn; clients that send no sampling fields (coding
agents among them) get the model's operator-chosen defaults instead.

A decoder says which fields its request left out (`GenerationRequest.left_out`; a field its API
does not have is always left out); the route applies the defaults of the model it chose.
"""

from __future__ import annotations

import msgspec

from protocols.generation import (
    GenerationRequest,
    MinP,
    RepetitionPenalty,
    Temperature,
    TopK,
    TopP,
)


class SamplingDefaults(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None


DEFAULTABLE = frozenset(SamplingDefaults.__struct_fields__)


def left_out(**given: object) -> frozenset[str]:
    """The defaultable fields a request left out: those given as None, and those its API does
    not have."""
    return DEFAULTABLE - {name for name, value in given.items() if value is not None}


def with_defaults(request: GenerationRequest, defaults: SamplingDefaults) -> GenerationRequest:
    """`request` sampling with `defaults` for the fields it left out."""
    fields = {
        name: value
        for name in request.left_out
        if (value := getattr(defaults, name, None)) is not None
    }
    if not fields:
        return request
    if "temperature" in fields:
        fields["do_sample"] = fields["temperature"] > 0
    options = msgspec.structs.replace(request.options, **fields)
    return msgspec.structs.replace(request, options=options)
