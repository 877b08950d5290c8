"""transformers' GenerationConfig fields on every protocol's decoder: accepted, the ones a
protocol cannot honour ignored and logged, anything else unknown refused. No engine."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from protocols.batch_payload import decode_batch
from protocols.control import Config, Control, decode_client, rest_config
from protocols.errors import GenerationError
from protocols.generation import SamplingOptions
from protocols.lmi_requests import InvalidPayload, decode_lmi
from protocols.rest_generate import decode_one
from protocols.tgi import decode_tgi
from protocols.transformers_fields import GENERATION_CONFIG_FIELDS
from protocols.ws_events import decode_starts

DEFAULTS = SamplingOptions(max_new_tokens=64)


def passed_through(**given: Any) -> dict[str, Any]:
    """What a client sends when it passes a GenerationConfig on: every field, most null."""
    from transformers import GenerationConfig

    fields: dict[str, Any] = GenerationConfig(**given).to_dict()  # type: ignore[no-untyped-call]
    return fields


def test_the_list_is_the_installed_transformers_generation_config() -> None:
    from transformers import GenerationConfig

    fields = GenerationConfig().to_dict()  # type: ignore[no-untyped-call]
    assert set(fields) == GENERATION_CONFIG_FIELDS


def test_every_protocol_takes_a_generation_config_as_it_is(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    config = passed_through(
        max_new_tokens=7, temperature=0.5, typical_p=0.9, epsilon_cutoff=0.01, num_beams=1
    )
    prompts = [{"request_id": "a", "prompt": "p"}]
    batch = decode_batch(json.dumps({"prompts": prompts, "generation_config": config}), DEFAULTS)
    assert not batch.rejected and batch.options.max_new_tokens == 7
    assert batch.options.temperature == 0.5 and batch.options.top_k == DEFAULTS.top_k  # null
    assert batch.options.typical_p == 0.9
    one = {"request_id": "a", "prompt": "p", "generation_config": config}
    assert decode_one(json.dumps(one).encode(), DEFAULTS).options.max_new_tokens == 7
    start = {"type": "START", "id": "s", "data": "p", "parameters": config}
    [accepted], refused = decode_starts(json.dumps([start]), DEFAULTS)
    assert not refused and accepted.options.max_new_tokens == 7
    message = decode_client(json.dumps({"type": "config", "prompt": "p", "parameters": config}))
    assert isinstance(message, Config) and message.parameters.temperature == 0.5
    flat = rest_config(json.dumps({"prompt": "p", "max_tokens": 3, **config}).encode())
    assert flat.parameters.max_tokens == 3 and flat.parameters.temperature == 0.5
    lmi = decode_lmi(
        json.dumps({"inputs": "p", "parameters": config}),
        formatter="",
        tgi_compat=False,
        max_new_tokens=30,
    )
    assert lmi.options.max_new_tokens == 7 and lmi.options.typical_p == 0.9
    tgi = decode_tgi(
        json.dumps({"inputs": "p", "parameters": config}),
        stream=False,
        full_text_default=False,
        max_new_tokens=30,
    )
    assert tgi.options.max_new_tokens == 7 and tgi.options.temperature == 0.5
    assert tgi.options.typical_p == 0.9
    warnings = [r.getMessage() for r in caplog.records if "GenerationConfig" in r.getMessage()]
    assert len(warnings) == 7 and all("epsilon_cutoff" in w for w in warnings)
    # typical_p is honoured where a protocol has it; the control protocol's has no such field.
    assert sum("typical_p" in w for w in warnings) == 2
    assert not any("transformers_version" in w for w in warnings)  # its metadata: silent


def test_early_stopping_reaches_beam_search_on_the_batch_protocols() -> None:
    prompts = [{"request_id": "a", "prompt": "p"}]
    config = {"num_beams": 2, "early_stopping": "never"}
    raw = json.dumps({"prompts": prompts, "stream_response": False, "generation_config": config})
    assert decode_batch(raw, DEFAULTS).options.early_stopping == "never"


def test_other_unknown_fields_are_refused_naming_them() -> None:
    unknown = {"typical_p": 0.5, "top_q": 1}
    prompts = [{"request_id": "a", "prompt": "p"}]
    raw = json.dumps({"prompts": prompts, "generation_config": unknown})
    [rejected] = decode_batch(raw, DEFAULTS).rejected
    assert rejected.error.field == "$.generation_config.top_q"
    # /ws's ERROR carries the message alone: it names the key, at the object holding it.
    assert "top_q" in rejected.error.message
    assert rejected.error.message.endswith(" - at `$.generation_config`")
    start = {"type": "START", "id": "s", "data": "p", "parameters": unknown}
    [], [refused] = decode_starts(json.dumps([start]), DEFAULTS)
    assert refused.error.field == "$[0].parameters.top_q"
    with pytest.raises(GenerationError) as caught:
        decode_client(json.dumps({"type": "control", "action": "modify", "parameters": unknown}))
    assert caught.value.field == "$.parameters.top_q"
    modify = {"type": "control", "action": "modify", "parameters": {"typical_p": 0.5}}
    assert isinstance(decode_client(json.dumps(modify)), Control)
    with pytest.raises(InvalidPayload) as refused_lmi:
        decode_lmi(
            json.dumps({"inputs": "p", "parameters": unknown}),
            formatter="",
            tgi_compat=False,
            max_new_tokens=30,
        )
    assert refused_lmi.value.error.field == "$.parameters.top_q"
    assert "top_q" in refused_lmi.value.error.message  # LMI's `error`: the message alone
    with pytest.raises(GenerationError) as refused_tgi:
        decode_tgi(
            json.dumps({"inputs": "p", "parameters": unknown}),
            stream=False,
            full_text_default=False,
            max_new_tokens=30,
        )
    assert refused_tgi.value.field == "$.parameters.top_q"
    assert "top_q" in refused_tgi.value.message  # TGI's `error`: the message alone
