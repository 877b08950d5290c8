"""ADAPTERS, the LoRA adapters served beside the base model: `name=path` pairs separated by
commas, or a directory whose subdirectories are adapters (each named for its directory), or
both. An adapter directory is what peft's `save_pretrained` writes: `adapter_config.json` and
its weights. A name is what requests ask for (OpenAI's `model`, TGI's `adapter_id`, ...)."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.config.settings import ConfigError, EngineSettings

ADAPTER_CONFIG = "adapter_config.json"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")


def configured_adapters(engine: EngineSettings) -> dict[str, Path]:
    """Each adapter ADAPTERS names, by name; raises ConfigError naming a bad entry."""
    adapters: dict[str, Path] = {}
    for entry in (e.strip() for e in engine.adapters.split(",")):
        if not entry:
            continue
        found = _named(entry) if "=" in entry else _directory(entry)
        for name, path in found.items():
            if name in adapters and adapters[name] != path:
                raise ConfigError(f"ADAPTERS names `{name}` twice: {adapters[name]} and {path}")
            adapters[name] = path
    return adapters


def lora_enabled(engine: EngineSettings) -> bool:
    return engine.enable_lora or bool(engine.adapters.strip())


def check_adapter_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ConfigError(
            f"`{name}` is not an adapter name: letters, digits and `._:/-`, at most 128"
        )
    return name


def check_adapter_path(name: str, path: Path) -> Path:
    if not (path / ADAPTER_CONFIG).is_file():
        raise ConfigError(f"adapter `{name}`: {path} has no {ADAPTER_CONFIG} (a peft adapter)")
    return path


def _named(entry: str) -> dict[str, Path]:
    name, _, where = entry.partition("=")
    name = check_adapter_name(name.strip())
    return {name: check_adapter_path(name, Path(where.strip()).expanduser())}


def _directory(entry: str) -> dict[str, Path]:
    root = Path(entry).expanduser()
    if (root / ADAPTER_CONFIG).is_file():  # one adapter, named for its directory
        return {check_adapter_name(root.name): root}
    if not root.is_dir():
        raise ConfigError(f"ADAPTERS: {root} is neither an adapter nor a directory of adapters")
    return {
        check_adapter_name(d.name): d
        for d in sorted(root.iterdir())
        if (d / ADAPTER_CONFIG).is_file()
    }
