"""LoRA adapters loaded into and unloaded from a running engine (the names an engine serves
are gateway/engine/lora.py's `Adapters`)."""

from __future__ import annotations

from pathlib import Path

from vllm.v1.engine.async_llm import AsyncLLM

from gateway.config.adapters import check_adapter_path
from gateway.config.settings import ConfigError
from gateway.engine.lora import Adapters
from protocols.errors import invalid


async def load_adapter(
    llm: AsyncLLM, adapters: Adapters, name: str, path: Path, lora_id: int | None = None
) -> None:
    """Serves `name` from `path` from now on (vLLM loads it at once, so a bad adapter is
    refused here), or raises INVALID_REQUEST naming the field at fault. `lora_id`: the id
    it has elsewhere (an engine replica's adapter has the gateway's id)."""
    from vllm.lora.request import LoRARequest

    adapters.check_new(name)
    try:
        check_adapter_path(name, path)
    except ConfigError as e:
        raise invalid(str(e), "lora_path") from e
    adapter = adapters.add(name, path, lora_id)
    try:
        await llm.add_lora(LoRARequest(name, adapter.lora_id, str(path)))
    except Exception as e:
        adapters.remove(name)
        raise invalid(f"The adapter at {path} could not be loaded: {e}", "lora_path") from e


async def unload_adapter(llm: AsyncLLM, adapters: Adapters, name: str) -> bool:
    """Serves `name` no more (False: it was not loaded). Requests running on it end as they
    would have; new ones are refused naming their field."""
    adapter = adapters.remove(name)
    if adapter is None:
        return False
    await llm.remove_lora(adapter.lora_id)
    return True
