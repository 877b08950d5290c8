"""ROPE_SCALING (gateway/config/rope_scaling.py): what it accepts, what it refuses naming the
setting, and the config overrides vLLM's engine is built with (the scaled engine itself:
tests/test_agents.py serves the agents' prompts on it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.config.loading import load_settings
from gateway.config.models_file import configured_models
from gateway.config.rope_scaling import RopeScaling, configured_rope_scaling, rope_overrides
from gateway.config.settings import ConfigError

SMOLLM2_ROPE = {"rope_theta": 100000.0, "rope_type": "default"}


def _scaling(value: str) -> RopeScaling | None:
    return configured_rope_scaling(load_settings({"ROPE_SCALING": value}, dotenv_path=None).engine)


def test_unset_is_the_models_own() -> None:
    assert _scaling("") is None
    assert configured_rope_scaling(load_settings({}, dotenv_path=None).engine) is None


@pytest.mark.parametrize(
    "value",
    ['{"rope_type": "yarn", "factor": 2}', '{"rope_type": "dynamic", "factor": 1.5}'],
)
def test_a_scaling_is_read(value: str) -> None:
    scaling = _scaling(value)
    assert scaling is not None
    assert (scaling.rope_type, scaling.factor) == tuple(json.loads(value).values())


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("yarn", "ROPE_SCALING"),
        ('{"rope_type": "yarn"}', "factor"),
        ('{"rope_type": "yarn", "factor": 1}', "factor"),
        ('{"rope_type": "longrope", "factor": 2}', "rope_type"),
        ('{"rope_type": "yarn", "factor": 2, "colour": 1}', "colour"),
        ('{"rope_type": "linear", "factor": 2, "beta_fast": 32}', "beta_fast"),
    ],
)
def test_a_bad_scaling_stops_start_up_naming_what(value: str, named: str) -> None:
    with pytest.raises(ConfigError) as refused:
        _scaling(value)
    assert str(refused.value).startswith("ROPE_SCALING: ")
    assert named in str(refused.value)


def test_yarn_keeps_the_models_theta_and_scales_its_positions() -> None:
    scaling = RopeScaling(rope_type="yarn", factor=2.0)
    assert rope_overrides(scaling, SMOLLM2_ROPE, 8192) == {
        "rope_parameters": {
            "rope_theta": 100000.0,
            "rope_type": "yarn",
            "factor": 2.0,
            "original_max_position_embeddings": 8192,
        },
        "max_position_embeddings": 16384,
    }


def test_dynamic_and_linear_leave_the_positions_to_vllm() -> None:
    """vLLM multiplies the model's positions by their factor itself."""
    for kind in ("dynamic", "linear"):
        overrides = rope_overrides(RopeScaling(rope_type=kind, factor=4.0), SMOLLM2_ROPE, 8192)
        assert overrides == {"rope_parameters": {**SMOLLM2_ROPE, "rope_type": kind, "factor": 4.0}}


@pytest.mark.parametrize(
    ("model_rope", "named"),
    [
        (None, "no RoPE"),
        ({"rope_type": "default"}, "no RoPE"),
        ({"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0}, "llama3"),
    ],
)
def test_a_model_without_a_rope_of_its_own_to_scale_is_refused(model_rope: Any, named: str) -> None:
    with pytest.raises(ConfigError, match=r"^ROPE_SCALING: ") as refused:
        rope_overrides(RopeScaling(rope_type="yarn", factor=2.0), model_rope, 8192)
    assert named in str(refused.value)


def test_a_models_file_table_scales_its_model(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text(
        '[models.long]\nsource = "default"\nrope_scaling = {rope_type = "yarn", factor = 2}\n'
        '[models.own]\nsource = "default"\n'
    )
    settings = load_settings({"MODELS_FILE": str(path)}, dotenv_path=None)
    long, own = configured_models(settings).models
    assert configured_rope_scaling(long.settings.engine) == RopeScaling("yarn", 2.0)
    assert configured_rope_scaling(own.settings.engine) is None


def test_a_models_file_tables_bad_scaling_names_the_table(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text('[models.long]\nrope_scaling = {rope_type = "yarn", factor = 0.5}\n')
    settings = load_settings({"MODELS_FILE": str(path)}, dotenv_path=None)
    with pytest.raises(ConfigError, match=r"^MODELS_FILE \[models\.long\] rope_scaling: "):
        configured_models(settings)


def test_the_engine_is_built_with_the_models_config_scaled(tmp_path: Path) -> None:
    pytest.importorskip("vllm", reason="the engine's arguments are vLLM's")
    from gateway.engine.engine_args import hf_overrides

    config = {"model_type": "llama", "max_position_embeddings": 4096, "rope_theta": 50000.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    settings = load_settings({"ROPE_SCALING": '{"rope_type": "yarn", "factor": 4}'}, None)
    overrides = hf_overrides(settings.engine, str(tmp_path))
    assert overrides["max_position_embeddings"] == 16384
    assert overrides["rope_parameters"]["rope_theta"] == 50000.0
    assert hf_overrides(load_settings({}, dotenv_path=None).engine, str(tmp_path)) == {}
