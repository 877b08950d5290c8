"""A tiny Llama with random weights and the default model's tokenizer: a second chat model to
serve beside SmolLM2 without a download (issue 57). Its text is noise, its engine is real:
vLLM loads it as any Llama, and its greedy answers are not SmolLM2's, so a test tells the two
apart by them. Made from a seed in about a second once torch and transformers are imported
(6.4 MB of bf16 weights beside the 3.5 MB tokenizer), then kept in the gateway's cache
directory. transformers and torch come with the engine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

NAME = "tiny-llama"
# Small dims vLLM's CPU backend takes: its attention computes head sizes 32, 64, 80, ... 512
# (vllm/v1/attention/backends/cpu_attn.py); grouped queries as in SmolLM2 (2 heads, 1 KV head).
_HIDDEN = 64
_HEAD_DIM = 32
_HEADS = 2
_KV_HEADS = 1
_LAYERS = 2
_INTERMEDIATE = 128
_CONTEXT_LENGTH = 8192  # SmolLM2's
# Wider than transformers' 0.02: the logits spread ten times as far (a standard deviation of
# about 1.6), so that rounding seldom decides a greedy choice (a chat prompt's first 14
# greedy tokens are the same in float32 and in bfloat16).
_STD = 0.2
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
)


def make_tiny_llama(tokenizer_dir: Path, out: Path, *, seed: int = 0) -> Path:
    """Builds the model in `out` (made if absent) with the tokenizer and chat template of
    `tokenizer_dir` (a Hugging Face model directory: the default model's); the same `seed`
    gives the same weights, byte for byte."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=_HIDDEN,
        intermediate_size=_INTERMEDIATE,
        num_hidden_layers=_LAYERS,
        num_attention_heads=_HEADS,
        num_key_value_heads=_KV_HEADS,
        head_dim=_HEAD_DIM,
        max_position_embeddings=_CONTEXT_LENGTH,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},  # SmolLM2's
        tie_word_embeddings=True,
        initializer_range=_STD,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model: Any = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    # Drawn here, not by transformers' initialisation (which may change between releases):
    # every matrix from one seeded generator in a fixed order, the norms' weights ones.
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, parameter in sorted(model.named_parameters(), key=lambda named: named[0]):
            if parameter.dim() == 1:
                parameter.fill_(1.0)
            else:
                values = torch.randn(parameter.shape, generator=generator) * _STD
                parameter.copy_(values)
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig.from_model_config(model.config).save_pretrained(out)
    for name in _TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copyfile(tokenizer_dir / name, out / name)
    return out


_RECIPE = "v1"  # change it when the recipe above changes: the cached copy is remade
_DONE = ".recipe.json"  # written last: a directory without it is remade


def _made(kept: Path) -> bool:
    try:
        return bool(json.loads((kept / _DONE).read_text()).get("recipe") == _RECIPE)
    except (OSError, ValueError, AttributeError):
        return False


def tiny_llama_dir(tokenizer_dir: Path | None = None) -> Path:
    """The tiny model, made once on this machine in the gateway's cache directory, with the
    default model's tokenizer (`tokenizer_dir`: its directory, prepared if not given)."""
    from gateway.config.cache import default_cache_dir
    from gateway.engine.default_model import prepare_default_model
    from gateway_bench.made_once import made_once

    def make(scratch: Path) -> Path:
        made = make_tiny_llama(tokenizer_dir or prepare_default_model(), scratch)
        (made / _DONE).write_text(json.dumps({"recipe": _RECIPE}) + "\n")
        return made

    return made_once(default_cache_dir() / "test-models" / f"{NAME}-{_RECIPE}", make, _made)
