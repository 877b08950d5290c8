"""`generation_config`, shared by the batch-events WebSocket and the REST routes.

Every field is optional; an absent one takes the server's default (the specs' "from .env").
`seed`, `stop`, `ignore_eos` and `min_tokens` are the gateway's documented extensions, and
`early_stopping` is transformers' (beam search). The other fields of transformers'
GenerationConfig are accepted and ignored (protocols/transformers_fields.py); any other
unknown field is an error.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from protocols.errors import invalid
from protocols.generation import (
    MAX_STOP_SEQUENCES,
    LengthPenalty,
    MaxNewTokens,
    MinTokens,
    NumBeams,
    RepetitionPenalty,
    SamplingOptions,
    Seed,
    Temperature,
    TopK,
    TopP,
    TypicalP,
    check_stop_count,
)
from protocols.transformers_fields import strip_ignored

STREAMING_BEAM_SEARCH_ERROR = (
    "`streamer` cannot be used with beam search (yet!). Make sure that `num_beams` is set to 1."
)


class GenerationConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    num_beams: NumBeams | UnsetType = UNSET
    do_sample: bool | UnsetType = UNSET
    temperature: Temperature | UnsetType = UNSET
    top_p: TopP | UnsetType = UNSET
    top_k: TopK | UnsetType = UNSET
    typical_p: TypicalP | UnsetType = UNSET
    max_new_tokens: MaxNewTokens | UnsetType = UNSET
    repetition_penalty: RepetitionPenalty | UnsetType = UNSET
    length_penalty: LengthPenalty | UnsetType = UNSET
    early_stopping: bool | Literal["never"] | UnsetType = UNSET
    seed: Seed | UnsetType | None = UNSET
    stop: list[str] | UnsetType = UNSET
    ignore_eos: bool | UnsetType = UNSET
    min_tokens: MinTokens | UnsetType = UNSET


ADAPTER_FIELD = "adapter_id"  # TGI's name for it: the seed protocols' way to name an adapter


def take_adapter(doc: dict[str, Any], key: str, path: str) -> str | None:
    """The LoRA adapter `doc[key]` (a generation_config) names as `adapter_id`, taken out of
    it (it chooses the model, not a generation option); `path` is that config's JSON path."""
    config = doc.get(key)
    if not isinstance(config, dict) or ADAPTER_FIELD not in config:
        return None
    name = config.pop(ADAPTER_FIELD)
    if name is not None and (not isinstance(name, str) or not name):
        field = f"{path}.{ADAPTER_FIELD}"
        raise invalid(
            f"`{ADAPTER_FIELD}` names an adapter: a non-empty string - at `{field}`", field
        )
    return name


def strip_generation_config(doc: dict[str, Any], key: str, where: str) -> None:
    """`doc[key]`, a generation_config, less the GenerationConfig fields it ignores (logged)."""
    strip_ignored(doc, key, GenerationConfig.__struct_fields__, where)


def resolve_options(
    config: GenerationConfig | None,
    defaults: SamplingOptions,
    *,
    streaming: bool,
    path: str = "$.generation_config",
    max_stop: int = MAX_STOP_SEQUENCES,
) -> SamplingOptions:
    """Merge the given fields over the defaults and check what one field alone cannot; at most
    `max_stop` stop strings (MAX_STOP_SEQUENCES)."""
    options = defaults
    if config is not None:
        given = {
            name: getattr(config, name)
            for name in config.__struct_fields__
            if getattr(config, name) is not UNSET
        }
        if "stop" in given:
            check_stop_count(given["stop"], max_stop, f"{path}.stop")
            given["stop"] = tuple(given["stop"])
        options = msgspec.structs.replace(defaults, **given)
    check_options(options, streaming=streaming, path=path)
    return options


def check_options(options: SamplingOptions, *, streaming: bool, path: str) -> None:
    if any(s == "" for s in options.stop):
        raise invalid(f"Stop strings must not be empty - at `{path}.stop`", f"{path}.stop")
    if options.min_tokens > options.max_new_tokens:
        raise invalid(
            f"min_tokens ({options.min_tokens}) must not exceed max_new_tokens "
            f"({options.max_new_tokens}) - at `{path}.min_tokens`",
            f"{path}.min_tokens",
        )
    if options.num_beams > 1 and streaming:
        raise invalid(STREAMING_BEAM_SEARCH_ERROR, f"{path}.num_beams")
