"""The chat models one gateway serves: MODEL's one, or MODELS_FILE's several (docs/MODELS.md).

MODELS_FILE is TOML: Python reads it with no package of its own (tomllib), its types are
explicit (a number, a string, a boolean: no YAML `no` read as false), and it is what
pyproject.toml is written in. Each `[models.<name>]` table is one model, `<name>` as clients
ask for it; `default` names the one protocols that name no model use:

    default = "smol"

    [models.smol]
    source = "default"          # the shipped SmolLM2, or a Hugging Face model directory
    keep_alive = -1             # Ollama's: a duration ("5m", "90s", 300), -1 never, 0 at once
                                # (the default model: -1 and pinned unless its table says)
    [models.tiny]
    source = "/models/tiny-llama"
    max_model_len = 2048
    kv_cache_gib = 0.5
    keep_alive = "5m"
    pinned = false

A model's engine settings are MODEL's (the environment's) but for what its table sets.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from gateway.config.adapters import configured_adapters
from gateway.config.rope_scaling import configured_rope_scaling
from gateway.config.sampling_defaults import configured_sampling_defaults
from gateway.config.settings import (
    ConfigError,
    EngineSettings,
    Settings,
    served_model_name,
)
from protocols.errors import GenerationError
from protocols.keep_alive import FOREVER
from protocols.keep_alive import keep_alive_seconds as keep_alive

DEFAULT_SOURCE = "default"  # the shipped SmolLM2 (gateway/engine/default_model.py)
DEFAULT_KEEP_ALIVE = 300.0  # Ollama's five minutes
_NAME = re.compile(r"[\x21-\x7e]{1,256}")  # printable, no space: it goes in paths and headers

Dtype = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]


class _ModelTable(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One `[models.<name>]` table as written."""

    source: str = DEFAULT_SOURCE
    task: Literal["generate"] = "generate"
    keep_alive: float | str | None = None
    pinned: bool | None = None  # None: the default model is pinned, the others are not
    dtype: Dtype | None = None
    max_model_len: Annotated[int, Meta(ge=1)] | None = None
    rope_scaling: dict[str, Any] | str | None = None  # ROPE_SCALING's, as a table or its JSON
    sampling_defaults: dict[str, Any] | str | None = None  # SAMPLING_DEFAULTS', the same
    kv_cache_gib: Annotated[float, Meta(gt=0)] | None = None
    max_num_seqs: Annotated[int, Meta(ge=1)] | None = None
    enforce_eager: bool | None = None
    chat_template: str | None = None
    tool_call_parser: str | None = None
    adapters: str | None = None  # as ADAPTERS: `name=path` pairs, or a directory of them
    enable_lora: bool | None = None


class _ModelsFile(msgspec.Struct, forbid_unknown_fields=True):
    models: dict[str, _ModelTable]
    default: str | None = None


class ChatModelSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One configured chat model: its `name`, the whole `settings` its engine, template and
    tool parser are built from, how long it stays loaded idle, and whether it ever unloads."""

    name: str
    source: str  # DEFAULT_SOURCE or a model directory
    settings: Settings
    keep_alive_seconds: float  # FOREVER: never unloaded for idleness
    pinned: bool


class ModelsConfig(msgspec.Struct, frozen=True):
    default: str
    models: tuple[ChatModelSpec, ...]


def keep_alive_seconds(value: float | str, where: str) -> float:
    """Ollama's keep_alive (protocols/keep_alive.py), its error naming `where`."""
    try:
        return keep_alive(value)
    except GenerationError as e:
        raise ConfigError(f"{where}: {e.message}") from e


def configured_models(settings: Settings) -> ModelsConfig:
    """MODELS_FILE's models, or MODEL's one (pinned: the one-model gateway never unloads)."""
    if not settings.models_file:
        name = served_model_name(settings.engine)
        source = settings.engine.model or DEFAULT_SOURCE
        one = ChatModelSpec(
            name=name, source=source, settings=settings, keep_alive_seconds=FOREVER, pinned=True
        )
        return ModelsConfig(name, (one,))
    path = Path(settings.models_file)
    try:
        raw = tomllib.loads(path.read_text())
        written = msgspec.convert(raw, _ModelsFile)
    except OSError as e:
        raise ConfigError(f"MODELS_FILE: cannot read {path}: {e.strerror}") from e
    except (tomllib.TOMLDecodeError, msgspec.ValidationError) as e:
        raise ConfigError(f"MODELS_FILE: {path}: {e}") from e
    if not written.models:
        raise ConfigError(f"MODELS_FILE: {path} names no model ([models.<name>] tables)")
    default = written.default or next(iter(written.models))
    if default not in written.models:
        raise ConfigError(f"MODELS_FILE: default {default!r} is not one of its [models] tables")
    specs = [
        _spec(
            name, table, settings, is_default=name == default, where=f"MODELS_FILE [models.{name}]"
        )
        for name, table in written.models.items()
    ]
    return ModelsConfig(default, tuple(specs))


def registered_spec(name: str, source: str, settings: Settings) -> ChatModelSpec:
    """A chat model registered at run time (DJL's management API): as a table naming only
    its source."""
    table = _ModelTable(source=source)
    return _spec(name, table, settings, is_default=False, where=f"model {name!r}")


def _spec(
    name: str, table: _ModelTable, base: Settings, *, is_default: bool, where: str
) -> ChatModelSpec:
    if not _NAME.fullmatch(name):
        raise ConfigError(f"{where}: a name is 1-256 printable characters with no space")
    if table.source != DEFAULT_SOURCE and not (Path(table.source) / "config.json").is_file():
        raise ConfigError(f"{where}: source {table.source!r} is not a model directory")
    engine_fields: dict[str, object] = {
        "model": "" if table.source == DEFAULT_SOURCE else table.source,
        "served_model_name": name,
    }
    if not is_default:  # ADAPTERS and ENABLE_LORA are the default model's
        engine_fields.update(adapters="", enable_lora=False)
    fields = ("dtype", "max_model_len", "kv_cache_gib", "max_num_seqs", "enforce_eager", "adapters")
    for field in fields:
        value = getattr(table, field)
        if value is not None:
            engine_fields[field] = value
    if table.enable_lora is not None:
        engine_fields["enable_lora"] = table.enable_lora
    if table.rope_scaling is not None:
        engine_fields["rope_scaling"] = _json_setting(table.rope_scaling)
    if table.sampling_defaults is not None:
        engine_fields["sampling_defaults"] = _json_setting(table.sampling_defaults)
    engine: EngineSettings = msgspec.structs.replace(base.engine, **engine_fields)
    try:
        configured_adapters(engine)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from e
    configured_rope_scaling(engine, f"{where} rope_scaling")
    configured_sampling_defaults(engine, f"{where} sampling_defaults")
    model_settings = msgspec.structs.replace(base, engine=engine)
    if table.chat_template is not None:
        model_settings = msgspec.structs.replace(model_settings, chat_template=table.chat_template)
    if table.tool_call_parser is not None:
        model_settings = msgspec.structs.replace(
            model_settings, tool_call_parser=table.tool_call_parser
        )
    if table.keep_alive is not None:
        keep = keep_alive_seconds(table.keep_alive, where)
    else:  # the default model stays, as MODEL's one does; the others are Ollama's
        keep = FOREVER if is_default else DEFAULT_KEEP_ALIVE
    return ChatModelSpec(
        name=name,
        source=table.source,
        settings=model_settings,
        keep_alive_seconds=keep,
        pinned=is_default if table.pinned is None else table.pinned,
    )


def _json_setting(value: str | dict[str, Any]) -> str:
    """A table's JSON-object setting (`rope_scaling`, `sampling_defaults`), written as a TOML
    table or as the JSON text, as the environment's variable."""
    return value if isinstance(value, str) else json.dumps(value)
