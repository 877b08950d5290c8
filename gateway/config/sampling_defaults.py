"""SAMPLING_DEFAULTS: a model's sampling for the fields a request of the OpenAI and Anthropic
routes leaves out (protocols/sampling_defaults.py), as vLLM's `--override-generation-config`:
a JSON object of `temperature`, `top_p`, `top_k`, `min_p` and `repetition_penalty`, each
within the bounds a request's own would be held to. Checked at start-up (ConfigError naming
the setting)."""

from __future__ import annotations

import msgspec

from gateway.config.settings import ConfigError, EngineSettings
from protocols.sampling_defaults import SamplingDefaults

SETTING = "SAMPLING_DEFAULTS"


def configured_sampling_defaults(engine: EngineSettings, where: str = SETTING) -> SamplingDefaults:
    """SAMPLING_DEFAULTS read and checked (empty: the APIs' own defaults)."""
    if not engine.sampling_defaults.strip():
        return SamplingDefaults()
    try:
        return msgspec.json.decode(engine.sampling_defaults, type=SamplingDefaults)
    except msgspec.DecodeError as e:
        raise ConfigError(
            f'{where}: {e} (a JSON object such as {{"temperature": 0.2, "top_p": 0.9}})'
        ) from e
