"""vLLM's adapter management requests: POST `/v1/load_lora_adapter` and
`/v1/unload_lora_adapter` (its server's shapes), answered in plain text, their errors OpenAI's
error object."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

# vLLM's clients may send an adapter's id; names are what count here, so it is only held to
# 64 bits, as every number a decoder reads is held to its bounds.
LoraId = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]


class LoadLoraAdapter(msgspec.Struct, forbid_unknown_fields=True):
    lora_name: str
    lora_path: str


class UnloadLoraAdapter(msgspec.Struct, forbid_unknown_fields=True):
    lora_name: str
    lora_int_id: LoraId | None = None


def loaded(name: str) -> str:
    return f"Success: LoRA adapter '{name}' added successfully."


def unloaded(name: str) -> str:
    return f"Success: LoRA adapter '{name}' removed successfully."


def not_loaded(name: str) -> str:
    return f"The lora adapter '{name}' cannot be found."
