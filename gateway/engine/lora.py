"""The LoRA adapters an engine serves: each name with the path it loads from and the id vLLM
knows it by (ids are never reused, so vLLM's cache and its prefix cache, whose block hashes
carry the adapter, never mix two adapters)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.config.adapters import check_adapter_name
from gateway.config.settings import ConfigError
from protocols.errors import invalid

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest


@dataclass(frozen=True)
class Adapter:
    name: str
    path: Path
    lora_id: int


class Adapters:
    """The adapters by name; empty when LoRA is off (`enabled` False). A request naming
    `base` (the served model's name) asks for no adapter."""

    def __init__(self, adapters: dict[str, Path], *, enabled: bool, base: str = "") -> None:
        self.enabled = enabled
        self.base = base
        self._ids = itertools.count(1)
        self._by_name: dict[str, Adapter] = {}
        for name, path in adapters.items():
            self.add(name, path)

    def check_new(self, name: str) -> None:
        """Raises INVALID_REQUEST naming `lora_name` unless `name` may be loaded at run time."""
        if not self.enabled:
            raise invalid("LoRA is off on this server: start it with ENABLE_LORA=true", "lora_name")
        if name in self or name == self.base:
            raise invalid(f"The adapter `{name}` is already loaded", "lora_name")
        try:
            check_adapter_name(name)
        except ConfigError as e:
            raise invalid(str(e), "lora_name") from e

    def add(self, name: str, path: Path, lora_id: int | None = None) -> Adapter:
        """Serves `name` from `path`, by a new id unless `lora_id` names the one it has
        elsewhere (an engine replica's adapter has the gateway's id)."""
        adapter = Adapter(name, path, next(self._ids) if lora_id is None else lora_id)
        self._by_name[name] = adapter
        return adapter

    def remove(self, name: str) -> Adapter | None:
        return self._by_name.pop(name, None)

    def find(self, name: str) -> Adapter | None:
        return self._by_name.get(name)

    @property
    def ids(self) -> dict[str, int]:
        """Each adapter's id, by name."""
        return {name: adapter.lora_id for name, adapter in self._by_name.items()}

    @property
    def names(self) -> list[str]:
        return sorted(self._by_name)

    @property
    def paths(self) -> dict[str, Path]:
        """Each adapter's path, by name, in name order."""
        return {name: self._by_name[name].path for name in self.names}

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def get(self, name: str, field: str) -> Adapter:
        """The adapter `name`, or INVALID_REQUEST naming `field`."""
        adapter = self._by_name.get(name)
        if adapter is not None:
            return adapter
        served = ", ".join(f"`{n}`" for n in self.names) or "none"
        raise invalid(
            f"Unknown adapter `{name}`: this server serves the adapters {served} "
            f"(ADAPTERS, docs/ADAPTERS.md) - at `{field}`",
            field,
        )

    def resolved(self, name: str | None) -> str | None:
        """The adapter `name` asks for: None for the base model, however named."""
        return None if name == self.base else name

    def check(self, name: str | None, field: str) -> str | None:
        """`resolved(name)`; raises INVALID_REQUEST naming `field` for an unknown adapter."""
        adapter = self.resolved(name)
        if adapter is not None:
            self.get(adapter, field)
        return adapter

    def lora_request(self, name: str | None, field: str = "adapter") -> LoRARequest | None:
        wanted = self.resolved(name)
        if wanted is None:
            return None
        from vllm.lora.request import LoRARequest

        adapter = self.get(wanted, field)
        return LoRARequest(adapter.name, adapter.lora_id, str(adapter.path))
