"""The llama-cpp bench target's build options (gateway_bench/llama_cpp.py): no native build,
AMX off, each instruction set only where the CPU has it."""

from __future__ import annotations

from gateway_bench.llama_cpp import cmake_flags


def test_build_names_the_cpus_instruction_sets_and_leaves_amx_off() -> None:
    flags = cmake_flags(frozenset({"avx", "avx2", "fma", "f16c", "avx512f", "amx_tile"}))
    assert "-DGGML_NATIVE=OFF" in flags
    assert {"-DGGML_AVX2=ON", "-DGGML_AVX512=ON", "-DGGML_FMA=ON"} <= set(flags)
    assert {"-DGGML_AVX512_BF16=OFF", "-DGGML_BMI2=OFF"} <= set(flags)
    assert {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"} <= set(flags)


def test_an_avx2_only_cpu_gets_no_avx512() -> None:
    flags = cmake_flags(frozenset({"avx", "avx2", "fma", "f16c", "bmi2"}))
    assert "-DGGML_AVX2=ON" in flags
    assert "-DGGML_AVX512=OFF" in flags
