"""Settings, read once from the environment and a `.env` file into typed objects.

The environment wins over `.env`. Every variable is documented in `.env.example`. An invalid
value raises `ConfigError` naming the variable, which stops start-up.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from dotenv import dotenv_values

from gateway.config.adapters import configured_adapters
from gateway.config.aliases import resolve_aliases
from gateway.config.priorities import parse_classes
from gateway.config.rope_scaling import configured_rope_scaling
from gateway.config.sampling_defaults import configured_sampling_defaults
from gateway.config.settings import GENERATION_PREFIX, ConfigError, EngineSettings, Settings
from protocols.errors import GenerationError, split_validation_message
from protocols.generation import SamplingOptions
from protocols.generation_config import GenerationConfig, check_options

_S = TypeVar("_S", bound=msgspec.Struct)


def load_settings(
    env: Mapping[str, str] | None = None, dotenv_path: str | Path | None = ".env"
) -> Settings:
    values: dict[str, str] = {}
    if dotenv_path is not None and Path(dotenv_path).is_file():
        values.update({k: v for k, v in dotenv_values(dotenv_path).items() if v is not None})
    values.update(os.environ if env is None else env)
    values = resolve_aliases(values)  # LMI's and TGI's names, where the gateway's own are unset
    engine = _convert(values, EngineSettings, "")
    configured_adapters(engine)  # every adapter named is there, before the engine is built
    configured_rope_scaling(engine)
    configured_sampling_defaults(engine)
    generation = _convert(_generation_fields(values), SamplingOptions, GENERATION_PREFIX)
    try:
        check_options(generation, streaming=False, path="$")
    except GenerationError as e:
        message, where = split_validation_message(e.message)
        name = GENERATION_PREFIX + (e.field or where).removeprefix("$.").upper()
        raise ConfigError(f"{name}: {message}") from e
    base = _convert(values, Settings, "", skip=("engine", "generation", "priority_classes", "otel"))
    if generation.num_beams > base.max_num_beams:
        raise ConfigError(
            f"DEFAULT_NUM_BEAMS: {generation.num_beams} is past MAX_NUM_BEAMS "
            f"({base.max_num_beams}): every request leaving num_beams out would be refused"
        )
    try:
        classes = {p.value: n for p, n in parse_classes(values).items()}
    except ValueError as e:
        raise ConfigError(str(e)) from e
    otel = {k: v for k, v in values.items() if k.startswith("OTEL_") and v != ""}
    return msgspec.structs.replace(
        base, engine=engine, generation=generation, priority_classes=classes, otel=otel
    )


def _generation_fields(values: Mapping[str, str]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name in GenerationConfig.__struct_fields__:
        raw = values.get(GENERATION_PREFIX + name.upper())
        if raw is None or raw == "":
            continue
        if name == "stop":
            fields[name] = [s for s in raw.split(",") if s]
        elif name == "seed" and raw.lower() == "none":
            fields[name] = None
        else:
            fields[name] = raw
    return fields


def _convert(
    values: Mapping[str, Any], kind: type[_S], prefix: str, skip: tuple[str, ...] = ()
) -> _S:
    """Convert env strings into `kind`; `prefix` maps a field back to its variable's name."""
    if prefix:
        subset = dict(values)  # already keyed by field name
    else:
        names = {f.upper() for f in kind.__struct_fields__ if f not in skip}
        subset = {k: v for k, v in values.items() if k in names and v != ""}
    try:
        return msgspec.convert(subset, kind, strict=False)
    except msgspec.ValidationError as e:
        message, where = split_validation_message(str(e))
        field = where.removeprefix("$").removeprefix(".").split(".")[0].split("[")[0]
        name = prefix + field.upper() if prefix else field
        raise ConfigError(f"{name or 'configuration'}: {message}") from e
