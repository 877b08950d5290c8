"""vLLM's adapter management requests: POST `/v1/load_lora_adapter` and
`/v1/unload_lora_adapter` (its server's shapes), answered in plain text, their errors OpenAI's
error object."""

from __future__ import annotations

import msgspec


class LoadLoraAdapter(msgspec.Struct, forbid_unknown_fields=True):
    lora_name: str
    lora_path: str


class UnloadLoraAdapter(msgspec.Struct, forbid_unknown_fields=True):
    lora_name: str
    lora_int_id: int | None = None  # vLLM's clients may send it; names are what count here


def loaded(name: str) -> str:
    return f"Success: LoRA adapter '{name}' added successfully."


def unloaded(name: str) -> str:
    return f"Success: LoRA adapter '{name}' removed successfully."


def not_loaded(name: str) -> str:
    return f"The lora adapter '{name}' cannot be found."
