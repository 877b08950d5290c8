"""The engine defaults follow the CPU: pure, no engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config.settings import ConfigError
from gateway.engine.cpu_defaults import (
    CPU_BULK_MAX_RUNNING,
    CPU_INTERACTIVE_STEP_TOKENS,
    CPU_KV_BLOCK_SIZE,
    CPU_MAX_NUM_BATCHED_TOKENS,
    cpu_flags,
    engine_environment,
    native_bfloat16,
    reported_flags,
    resolve_bulk_cap,
    resolve_dtype,
    resolve_interactive_step_tokens,
    resolve_kv_block_size,
    resolve_max_num_batched_tokens,
    resolve_typical_sampling,
)

AVX2_ONLY = frozenset({"fpu", "sse4_2", "avx", "avx2", "fma"})
AVX512_BF16 = AVX2_ONLY | {"avx512f", "avx512_bf16"}
AMX = AVX2_ONLY | {"avx512f", "amx_bf16", "amx_tile"}


def test_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512f avx512_bf16\n\n"
        "processor\t: 1\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
    )
    assert cpu_flags(cpuinfo) == {"fpu", "avx2", "avx512f", "avx512_bf16"}
    assert cpu_flags(tmp_path / "absent") == frozenset()


def test_auto_on_a_cpu_without_native_bfloat16_serves_float32() -> None:
    dtype, reason = resolve_dtype("auto", "cpu", AVX2_ONLY)
    assert dtype == "float32" and "no native bfloat16" in reason
    assert not native_bfloat16(AVX2_ONLY)


def test_auto_on_a_cpu_with_avx512_bf16_or_amx_serves_bfloat16() -> None:
    assert resolve_dtype("auto", "cpu", AVX512_BF16) == (
        "bfloat16",
        "the CPU computes bfloat16 natively (avx512_bf16)",
    )
    dtype, reason = resolve_dtype("auto", "cpu", AMX)
    assert dtype == "bfloat16" and "amx_bf16" in reason


def test_cuda_keeps_the_models_dtype_and_an_explicit_dtype_wins() -> None:
    assert resolve_dtype("auto", "cuda", AVX2_ONLY)[0] == "auto"
    assert resolve_dtype("bfloat16", "cpu", AVX2_ONLY) == ("bfloat16", "set by DTYPE")


def test_reported_flags_name_only_those_that_decide() -> None:
    assert reported_flags(AMX) == ["avx2", "avx512f", "amx_bf16"]


def test_on_two_cores_the_model_has_both_in_the_engine_cores_process_and_own_settings_win() -> None:
    chosen = engine_environment({}, cpus={1, 0})
    assert chosen == {
        "VLLM_CPU_OMP_THREADS_BIND": "0,1",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    assert engine_environment(
        {"VLLM_CPU_OMP_THREADS_BIND": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}, cpus={0, 1}
    ) == {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}


def test_on_a_larger_machine_vllms_own_binding_is_kept() -> None:
    assert engine_environment({}, cpus=set(range(16))) == {}


def test_the_bulk_cap_is_on_for_a_cpu_and_off_for_a_gpu_unless_set() -> None:
    assert resolve_bulk_cap("auto", "cpu") == CPU_BULK_MAX_RUNNING > 0
    assert resolve_bulk_cap("auto", "cuda") == 0
    assert resolve_bulk_cap(0, "cpu") == 0
    assert resolve_bulk_cap(8, "cuda") == 8


def test_a_cpu_steps_tokens_are_bounded_beside_a_chat_and_a_gpu_keeps_vllms_budget() -> None:
    assert resolve_interactive_step_tokens("auto", "cpu") == CPU_INTERACTIVE_STEP_TOKENS > 0
    assert resolve_interactive_step_tokens("auto", "cuda") == 0
    assert resolve_interactive_step_tokens(0, "cpu") == 0
    assert resolve_interactive_step_tokens(512, "cuda") == 512


def test_every_cpu_step_is_bounded_and_a_gpu_keeps_vllms_budget() -> None:
    assert resolve_max_num_batched_tokens("auto", "cpu") == CPU_MAX_NUM_BATCHED_TOKENS > 0
    assert resolve_max_num_batched_tokens("auto", "cuda") == 0
    assert resolve_max_num_batched_tokens(0, "cpu") == 0
    assert resolve_max_num_batched_tokens(4096, "cpu") == 4096


def test_a_cpus_kv_blocks_are_small_enough_to_cache_a_shared_prompt_and_a_gpu_keeps_vllms() -> None:
    assert resolve_kv_block_size("auto", "cpu") == CPU_KV_BLOCK_SIZE > 0
    assert resolve_kv_block_size("auto", "cuda") == 0
    assert resolve_kv_block_size(0, "cpu") == 0
    assert resolve_kv_block_size(128, "cpu") == 128
    assert resolve_kv_block_size(16, "cuda") == 16


def test_typical_sampling_is_on_by_default_on_a_cpu_only() -> None:
    assert resolve_typical_sampling("auto", "cpu") is True
    assert resolve_typical_sampling("auto", "cuda") is False
    assert resolve_typical_sampling(True, "cuda") is True
    assert resolve_typical_sampling(False, "cpu") is False


def test_a_kv_block_the_cpu_kernels_cannot_take_is_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match=r"KV_BLOCK_SIZE=16: .* multiple of 32"):
        resolve_kv_block_size(16, "cpu")
