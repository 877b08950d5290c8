"""ROPE_SCALING: a context longer than the one a model was trained with, by scaling its rotary
position embeddings (RoPE) as transformers defines them (`rope_parameters`). vLLM takes it as
`hf_overrides` of the model's config (its public engine argument), and the positions the model
then serves are its own times the factor: YaRN's (`yarn`), dynamic NTK's (`dynamic`: in vLLM a
fixed NTK base for the scaled length) or position interpolation's (`linear`).

Written as a JSON object: `{"rope_type": "yarn", "factor": 2}`, YaRN's own keys optional
(`beta_fast`, `beta_slow`, `attention_factor`, `original_max_position_embeddings`, each as
transformers names it). The object is checked at start-up (ConfigError naming ROPE_SCALING);
what it needs of the model (a RoPE of its own, not already scaled) when the engine is built.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from gateway.config.settings import ConfigError, EngineSettings

SETTING = "ROPE_SCALING"


class RopeScaling(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    rope_type: Literal["yarn", "dynamic", "linear"]
    factor: Annotated[float, Meta(gt=1)]
    # YaRN's, transformers' defaults when left out (the original positions: the model's own)
    beta_fast: Annotated[float, Meta(gt=0)] | None = None
    beta_slow: Annotated[float, Meta(gt=0)] | None = None
    attention_factor: Annotated[float, Meta(gt=0)] | None = None
    original_max_position_embeddings: Annotated[int, Meta(ge=1)] | None = None


_YARN_ONLY = ("beta_fast", "beta_slow", "attention_factor", "original_max_position_embeddings")


def configured_rope_scaling(engine: EngineSettings, where: str = SETTING) -> RopeScaling | None:
    """ROPE_SCALING read and checked (None: the model's own RoPE); ConfigError naming `where`."""
    if not engine.rope_scaling.strip():
        return None
    try:
        scaling = msgspec.json.decode(engine.rope_scaling, type=RopeScaling)
    except msgspec.DecodeError as e:
        raise ConfigError(
            f'{where}: {e} (a JSON object such as {{"rope_type": "yarn", "factor": 2}})'
        ) from e
    if scaling.rope_type != "yarn":
        given = [k for k in _YARN_ONLY if getattr(scaling, k) is not None]
        if given:
            raise ConfigError(f"{where}: {given[0]} is YaRN's (rope_type yarn)")
    return scaling


def rope_overrides(
    scaling: RopeScaling, model_rope: Any, max_positions: int, where: str = SETTING
) -> dict[str, Any]:
    """The `hf_overrides` of vLLM's engine for `scaling` on a model whose config has
    `model_rope` (its `rope_parameters`) and `max_positions` (`max_position_embeddings`)."""
    theta = model_rope.get("rope_theta") if isinstance(model_rope, dict) else None
    if not isinstance(theta, int | float):
        raise ConfigError(f"{where}: the model's config has no RoPE (rope_parameters) to scale")
    if model_rope.get("rope_type", "default") != "default":
        raise ConfigError(
            f"{where}: the model's RoPE is already scaled ({model_rope['rope_type']}): "
            "its own config says its context"
        )
    parameters = {**model_rope, **msgspec.to_builtins(scaling)}
    overrides: dict[str, Any] = {"rope_parameters": parameters}
    if scaling.rope_type == "yarn":
        # vLLM (as transformers) reads a YaRN model's max_position_embeddings as the scaled
        # length, and the trained one from the parameters.
        original = scaling.original_max_position_embeddings or max_positions
        parameters["original_max_position_embeddings"] = original
        overrides["max_position_embeddings"] = int(original * scaling.factor)
    return overrides
