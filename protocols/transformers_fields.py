"""Hugging Face transformers' GenerationConfig field names, accepted by every protocol.

A client may pass a `GenerationConfig` through as it is (`to_dict()`, or a model's
`generation_config.json`) wherever a protocol takes generation parameters. The one rule
(docs/PROTOCOLS.md, "Hugging Face generation fields"): a protocol honours the fields it has a
field of its own for; every other GenerationConfig field is accepted, ignored and logged,
never refused; anything else unknown is refused by the protocol's decoder, naming it. A
GenerationConfig field given as null asks for nothing: the protocol's default.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

log = logging.getLogger(__name__)

# transformers 5.19's GenerationConfig (`GenerationConfig().to_dict()`); tests/test_protocols.py
# checks this against the installed transformers.
GENERATION_CONFIG_FIELDS: frozenset[str] = frozenset(
    {
        "_from_model_config", "assistant_confidence_threshold", "assistant_early_exit",
        "assistant_ensemble_weight", "assistant_lookbehind", "bad_words_ids",
        "begin_suppress_tokens", "bos_token_id", "cache_config", "cache_implementation",
        "compile_config", "constraints", "continuous_batching_config", "decoder_start_token_id",
        "disable_compile", "diversity_penalty", "do_sample", "dola_layers", "early_stopping",
        "encoder_no_repeat_ngram_size", "encoder_repetition_penalty", "eos_token_id",
        "epsilon_cutoff", "eta_cutoff", "exponential_decay_length_penalty", "force_words_ids",
        "forced_bos_token_id", "forced_eos_token_id", "guidance_scale", "is_assistant",
        "length_penalty", "low_memory", "max_cache_len", "max_length", "max_matching_ngram_size",
        "max_new_tokens", "max_time", "min_length", "min_new_tokens", "min_p",
        "no_repeat_ngram_size", "num_assistant_tokens", "num_assistant_tokens_schedule",
        "num_beam_groups", "num_beams", "num_return_sequences", "output_attentions",
        "output_hidden_states", "output_logits", "output_scores", "pad_token_id",
        "penalty_alpha", "prefill_chunk_size", "prompt_lookup_num_tokens",
        "remove_invalid_values", "renormalize_logits", "repetition_penalty",
        "return_dict_in_generate", "sequence_bias", "speculation_type", "stop_strings",
        "suppress_tokens", "target_lookbehind", "temperature", "token_healing", "top_h",
        "top_k", "top_p", "transformers_version", "typical_p", "use_cache", "use_mtp",
        "watermarking_config",
    }
)  # fmt: skip
# Written by transformers itself, not asked by the client: accepted without a warning.
_METADATA = frozenset({"_from_model_config", "transformers_version"})


def without_ignored(parameters: dict[str, Any], own: Collection[str], where: str) -> dict[str, Any]:
    """`parameters` less the GenerationConfig fields that are not in `own` (the protocol's
    fields) and those given as null; the ignored ones given a value are logged, `where` being
    the protocol and its field (e.g. "/ws generation_config")."""
    kept: dict[str, Any] = {}
    ignored: list[str] = []
    for name, value in parameters.items():
        if name not in GENERATION_CONFIG_FIELDS or (name in own and value is not None):
            kept[name] = value
        elif name not in own and value is not None and name not in _METADATA:
            ignored.append(name)
    if ignored:
        log.warning(
            "%s: ignored transformers GenerationConfig fields this server cannot honour: %s",
            where,
            ", ".join(ignored),
        )
    return kept


def strip_ignored(doc: dict[str, Any], key: str, own: Collection[str], where: str) -> None:
    """`doc[key]`, when it is an object, without its ignored fields (see `without_ignored`)."""
    parameters = doc.get(key)
    if isinstance(parameters, dict):
        doc[key] = without_ignored(parameters, own, where)
