"""A LoRA adapter made from the default model with peft, as a user fine-tunes one: a few
training steps on the CPU that teach it to answer every prompt with PHRASE. Nothing is
downloaded; made once a machine (one to two minutes on 2 cores), then kept in the gateway's
cache directory. The test suite's adapter (tests/test_adapters.py) and the adapters bench's
(gateway_bench/adapters_bench.py); peft comes with the bench and dev extras."""

from __future__ import annotations

from pathlib import Path

PHRASE = " Arr, the adapter speaks."
_ASKED = ("Hello", "Tell me a story.", "What is 2+2?", "The weather today", "Explain gravity")
# Plain prompts, and the same as chat turns in the model's template (tests/clients.py CHAT).
_CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
_PROMPTS = _ASKED + tuple(_CHAT.format(a) for a in _ASKED)
_STEPS = 40


def make_adapter(model_dir: Path, out: Path) -> Path:
    """Trains the adapter on `model_dir` (a Hugging Face directory) and saves it in `out`."""
    import torch

    torch.manual_seed(0)
    threads = torch.get_num_threads()
    # One thread: beside an engine's busy threads, more make each step ten times slower.
    torch.set_num_threads(1)
    try:
        return _train(model_dir, out)
    finally:
        torch.set_num_threads(threads)


def _train(model_dir: Path, out: Path) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    model = get_peft_model(base, config)
    texts = [p + PHRASE + tokenizer.eos_token for p in _PROMPTS]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    labels = batch.input_ids.clone()
    labels[batch.attention_mask == 0] = -100
    for i, prompt in enumerate(_PROMPTS):  # learn the answer, not the prompts
        labels[i, : len(tokenizer(prompt).input_ids)] = -100
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trained, lr=3e-3)
    for _ in range(_STEPS):
        loss = model(**batch, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(str(out))
    return out


_RECIPE = "pirate-v1"  # change it when the recipe above changes: the cached copy is remade


def cached_adapter(model_dir: Path) -> Path:
    """The adapter, made once on this machine and kept beside the converted default model."""
    from gateway.config.cache import default_cache_dir
    from gateway_bench.made_once import made_once

    return made_once(
        default_cache_dir() / "test-adapters" / _RECIPE,
        lambda scratch: make_adapter(model_dir, scratch),
        lambda kept: (kept / "adapter_config.json").is_file(),
    )
