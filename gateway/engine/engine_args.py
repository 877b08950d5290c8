"""The arguments vLLM's engine is built with, from the settings and the device it runs on."""

from __future__ import annotations

import logging
import os
from typing import Any

from transformers import AutoConfig
from vllm.engine.arg_utils import AsyncEngineArgs

from gateway.config.adapters import lora_enabled
from gateway.config.rope_scaling import configured_rope_scaling, rope_overrides
from gateway.config.settings import EngineSettings
from gateway.engine.bulk_scheduler import BulkCapScheduler, engine_config
from gateway.engine.cpu_defaults import (
    cpu_flags,
    engine_environment,
    reported_flags,
    resolve_bulk_cap,
    resolve_dtype,
    resolve_interactive_step_tokens,
    resolve_kv_block_size,
    resolve_max_num_batched_tokens,
    resolve_typical_sampling,
)
from gateway.engine.typical_sampling import TYPICAL_SAMPLING

log = logging.getLogger(__name__)
GIB = 1 << 30
# By name: importing it patches vLLM's model runner, which only the worker process should load.
SEEDED_SAMPLING_ON_CPU = "gateway.engine.seeded_cpu_worker.SeededSamplingOnCpu"


def engine_args(settings: EngineSettings, model: str) -> AsyncEngineArgs:
    bulk_cap = resolve_bulk_cap(settings.bulk_max_running, device_type())
    step_tokens = resolve_interactive_step_tokens(settings.interactive_step_tokens, device_type())
    own_scheduler = settings.scheduling_policy == "priority" and (bulk_cap > 0 or step_tokens > 0)
    return AsyncEngineArgs(
        model=model,
        served_model_name=[settings.served_model_name] if settings.served_model_name else None,
        max_model_len=settings.max_model_len,
        hf_overrides=hf_overrides(settings, model),
        kv_cache_memory_bytes=int(settings.kv_cache_gib * GIB),
        enforce_eager=settings.enforce_eager,
        enable_prefix_caching=settings.enable_prefix_caching,
        block_size=resolve_kv_block_size(settings.kv_block_size, device_type()) or None,
        tensor_parallel_size=settings.tensor_parallel_size,
        pipeline_parallel_size=settings.pipeline_parallel_size,
        dtype=settings.dtype,
        seed=settings.seed,
        scheduling_policy=settings.scheduling_policy,
        max_num_batched_tokens=resolve_max_num_batched_tokens(
            settings.max_num_batched_tokens, device_type()
        )
        or None,
        max_num_seqs=settings.max_num_seqs or None,
        scheduler_cls=f"{BulkCapScheduler.__module__}.{BulkCapScheduler.__name__}"
        if own_scheduler
        else None,
        additional_config=engine_config(settings.bulk_priority, bulk_cap, step_tokens),
        # The cap's scheduler extends vLLM's synchronous one (a CPU engine's only kind).
        async_scheduling=False if own_scheduler else None,
        # Seeded requests longer than a step would kill a CPU worker without it.
        worker_extension_cls=SEEDED_SAMPLING_ON_CPU,
        logits_processors=[TYPICAL_SAMPLING]
        if resolve_typical_sampling(settings.typical_sampling, device_type())
        else None,
        enable_lora=lora_enabled(settings),
        max_loras=settings.max_loras,
        max_lora_rank=settings.max_lora_rank,
    )


def hf_overrides(settings: EngineSettings, model: str) -> dict[str, Any]:
    """What the settings change of the model's config (vLLM's `hf_overrides`): ROPE_SCALING's
    RoPE, from the model's own (gateway/config/rope_scaling.py)."""
    scaling = configured_rope_scaling(settings)
    if scaling is None:
        return {}
    config = AutoConfig.from_pretrained(model).get_text_config()
    return rope_overrides(
        scaling, getattr(config, "rope_parameters", None), config.max_position_embeddings
    )


def device_type() -> str:
    """The device vLLM runs on here: cpu, cuda..."""
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def shutdown_grace_seconds() -> float | None:
    """How long an engine being shut down is given before vLLM kills its processes. On a CPU
    the worker's own teardown outlasts vLLM's 5 s default every time (measured: it is killed
    at 5 s, having freed nothing the exit would not free), so one second; a GPU's keeps vLLM's
    default, whose teardown releases device memory a kill could leave held."""
    return 1.0 if device_type() == "cpu" else None


def engine_dtype(requested: str, engine: str) -> tuple[str, str]:
    """The dtype an engine about to be built runs in, and why (logged as `engine`'s); on the
    CPU backend vLLM's thread settings go into the environment first (cpu_defaults.py)."""
    device = device_type()
    flags = cpu_flags()
    dtype, reason = resolve_dtype(requested, device, flags)
    if device == "cpu":
        os.environ.update(engine_environment(os.environ))
    log.info("%s dtype %s: %s (CPU flags: %s)", engine, dtype, reason, reported_flags(flags))
    return dtype, reason
