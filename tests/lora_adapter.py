"""A LoRA adapter made from the default model with peft, as a user fine-tunes one: a few
training steps on the CPU that teach it to answer every prompt with PHRASE. Nothing is
downloaded; made once a session (about half a minute on 2 cores)."""

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
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
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
    model.save_pretrained(out)
    return out
