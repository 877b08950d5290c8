"""The engine's dtype, step budget and KV block size follow the settings and the device, and
the server says which dtype it chose and why. (The test engine asks for float32,
tests/serving.py; what "auto" picks on each kind of CPU is tests/test_cpu_defaults.py.)"""

from __future__ import annotations

from typing import TYPE_CHECKING

from clients import web
from gateway.engine.cpu_defaults import (
    CPU_KV_BLOCK_SIZE,
    CPU_MAX_NUM_BATCHED_TOKENS,
    cpu_flags,
    reported_flags,
    resolve_dtype,
)
from serving import RunningServer

if TYPE_CHECKING:
    from gateway.engine.vllm_engine import VllmEngine


def test_info_and_metrics_report_the_dtype_chosen_for_this_cpu(server: RunningServer) -> None:
    dtype, reason = resolve_dtype(server.gateway.settings.engine.dtype, "cpu", cpu_flags())
    info = web.get(server.http + "/info").json()
    assert info["model_dtype"] == f"torch.{dtype}"
    metrics = web.get(server.http + "/metrics").text
    flags = " ".join(reported_flags(cpu_flags()))
    line = next(m for m in metrics.splitlines() if m.startswith("gateway_engine_info{"))
    assert f'dtype="{dtype}"' in line and f'dtype_reason="{reason}"' in line
    assert f'cpu_flags="{flags}"' in line


def test_a_cpu_engines_steps_take_the_gateways_budget(
    server: RunningServer, engine: VllmEngine
) -> None:
    assert server.gateway.settings.engine.max_num_batched_tokens == "auto"
    budget = engine.llm.vllm_config.scheduler_config.max_num_batched_tokens
    assert budget == CPU_MAX_NUM_BATCHED_TOKENS < 2048  # vLLM's own on a CPU


def test_a_cpu_engines_kv_blocks_take_the_gateways_size(
    server: RunningServer, engine: VllmEngine
) -> None:
    assert server.gateway.settings.engine.kv_block_size == "auto"
    block = engine.llm.vllm_config.cache_config.block_size
    assert block == CPU_KV_BLOCK_SIZE < 128  # vLLM's own on a CPU
