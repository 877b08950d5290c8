"""The arguments vLLM's engine is built with, from the settings and the device it runs on."""

from __future__ import annotations

from vllm.engine.arg_utils import AsyncEngineArgs

from gateway.config.adapters import lora_enabled
from gateway.config.settings import EngineSettings
from gateway.engine.bulk_scheduler import BulkCapScheduler, engine_config
from gateway.engine.cpu_defaults import (
    resolve_bulk_cap,
    resolve_interactive_step_tokens,
    resolve_max_num_batched_tokens,
)

GIB = 1 << 30


def engine_args(settings: EngineSettings, model: str) -> AsyncEngineArgs:
    bulk_cap = resolve_bulk_cap(settings.bulk_max_running, device_type())
    step_tokens = resolve_interactive_step_tokens(settings.interactive_step_tokens, device_type())
    own_scheduler = settings.scheduling_policy == "priority" and (bulk_cap > 0 or step_tokens > 0)
    return AsyncEngineArgs(
        model=model,
        served_model_name=[settings.served_model_name] if settings.served_model_name else None,
        max_model_len=settings.max_model_len,
        kv_cache_memory_bytes=int(settings.kv_cache_gib * GIB),
        enforce_eager=settings.enforce_eager,
        enable_prefix_caching=settings.enable_prefix_caching,
        tensor_parallel_size=settings.tensor_parallel_size,
        pipeline_parallel_size=settings.pipeline_parallel_size,
        dtype=settings.dtype,
        seed=settings.seed,
        scheduling_policy=settings.scheduling_policy,
        max_num_batched_tokens=resolve_max_num_batched_tokens(
            settings.max_num_batched_tokens, device_type()
        )
        or None,
        scheduler_cls=f"{BulkCapScheduler.__module__}.{BulkCapScheduler.__name__}"
        if own_scheduler
        else None,
        additional_config=engine_config(settings.bulk_priority, bulk_cap, step_tokens),
        # The cap's scheduler extends vLLM's synchronous one (a CPU engine's only kind).
        async_scheduling=False if own_scheduler else None,
        enable_lora=lora_enabled(settings),
        max_loras=settings.max_loras,
        max_lora_rank=settings.max_lora_rank,
    )


def device_type() -> str:
    """The device vLLM runs on here: cpu, cuda..."""
    from vllm.platforms import current_platform

    return str(current_platform.device_type)
