"""SAMPLING_DEFAULTS (protocols/sampling_defaults.py, gateway/config/sampling_defaults.py):
which fields each route's request left out, the served model's defaults in their place, and
the setting's checks. On the engine: tests/test_agents.py serves the agents with them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.config.loading import load_settings
from gateway.config.models_file import configured_models
from gateway.config.sampling_defaults import configured_sampling_defaults
from gateway.config.settings import ConfigError
from protocols.anthropic_requests import decode_messages
from protocols.openai_requests import decode_chat, decode_completion
from protocols.responses_requests import decode_responses, defaulted
from protocols.sampling_defaults import DEFAULTABLE, SamplingDefaults, with_defaults

COOL = SamplingDefaults(temperature=0.2, top_p=0.9, top_k=40, min_p=0.05)
USER = [{"role": "user", "content": "hi"}]


def _raw(**body: object) -> bytes:
    return json.dumps(body).encode()


def test_an_anthropic_request_leaving_sampling_out_takes_the_defaults() -> None:
    [request] = decode_messages(_raw(model="m", max_tokens=8, messages=USER)).requests
    assert request.left_out == DEFAULTABLE
    options = with_defaults(request, COOL).options
    assert (options.temperature, options.top_p, options.top_k, options.min_p) == (
        0.2,
        0.9,
        40,
        0.05,
    )
    assert options.do_sample
    assert options.repetition_penalty == 1.0  # no default given: the API's


def test_what_a_request_gives_is_its_own() -> None:
    body = _raw(model="m", max_tokens=8, messages=USER, temperature=1.0, top_k=5)
    [request] = decode_messages(body).requests
    options = with_defaults(request, COOL).options
    assert (options.temperature, options.top_k, options.top_p) == (1.0, 5, 0.9)


def test_chat_and_completions_leave_out_what_they_do_not_send() -> None:
    chat = decode_chat(_raw(messages=USER, temperature=0.5, min_p=0.1), 2048)
    assert all(r.left_out == DEFAULTABLE - {"temperature", "min_p"} for r in chat.requests)
    completion = decode_completion(_raw(prompt="hi", top_p=0.5, stream=True, n=2), 2048)
    assert len(completion.requests) == 2
    assert all(r.left_out == DEFAULTABLE - {"top_p"} for r in completion.requests)


def test_a_default_temperature_of_zero_is_greedy() -> None:
    [request] = decode_messages(_raw(model="m", max_tokens=8, messages=USER)).requests
    options = with_defaults(request, SamplingDefaults(temperature=0.0)).options
    assert (options.temperature, options.do_sample) == (0.0, False)


def test_no_defaults_change_nothing() -> None:
    [request] = decode_messages(_raw(model="m", max_tokens=8, messages=USER)).requests
    assert with_defaults(request, SamplingDefaults()) is request


def test_a_response_reports_the_sampling_it_was_given() -> None:
    call = decode_responses(_raw(model="m", input="hi", top_p=0.5), 2048)
    assert call.request.left_out == DEFAULTABLE - {"top_p"}
    given = defaulted(call, COOL)
    assert (given.echo["temperature"], given.echo["top_p"]) == (0.2, 0.5)
    assert (given.request.options.temperature, given.request.options.top_k) == (0.2, 40)
    assert defaulted(call, SamplingDefaults()) is call


def test_the_setting_is_read() -> None:
    settings = load_settings({"SAMPLING_DEFAULTS": '{"temperature": 0.2, "top_p": 0.9}'}, None)
    assert configured_sampling_defaults(settings.engine) == SamplingDefaults(0.2, 0.9)
    assert configured_sampling_defaults(load_settings({}, None).engine) == SamplingDefaults()


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("0.2", "SAMPLING_DEFAULTS"),
        ('{"temperature": 3}', "temperature"),
        ('{"top_p": 0}', "top_p"),
        ('{"seed": 1}', "seed"),
    ],
)
def test_a_bad_setting_stops_start_up_naming_what(value: str, named: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings({"SAMPLING_DEFAULTS": value}, dotenv_path=None)
    assert str(refused.value).startswith("SAMPLING_DEFAULTS: ")
    assert named in str(refused.value)


def test_a_models_file_table_gives_its_models_defaults(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text(
        '[models.cool]\nsource = "default"\nsampling_defaults = {temperature = 0.2}\n'
        '[models.bad]\nsource = "default"\nsampling_defaults = {temperature = -1}\n'
    )
    settings = load_settings({"MODELS_FILE": str(path)}, dotenv_path=None)
    with pytest.raises(ConfigError, match=r"^MODELS_FILE \[models\.bad\] sampling_defaults: "):
        configured_models(settings)
    path.write_text('[models.cool]\nsource = "default"\nsampling_defaults = {temperature = 0.2}\n')
    [cool] = configured_models(settings).models
    assert configured_sampling_defaults(cool.settings.engine) == SamplingDefaults(0.2)
