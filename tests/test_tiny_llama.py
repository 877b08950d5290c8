"""The tiny random Llama (gateway_bench/tiny_llama.py), a second chat model made here: built
the same from the same seed, served by a real vLLM engine of its own, and told apart from
SmolLM2 by its greedy answer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from gateway_bench.tiny_llama import make_tiny_llama, tiny_llama_dir
from protocols.generation import SamplingOptions
from serving import LoopThread, gateway_settings

if TYPE_CHECKING:
    from gateway.engine.vllm_engine import VllmEngine

pytestmark = pytest.mark.own_engine  # an engine of its own: make test-all
GREEDY = SamplingOptions(do_sample=False, max_new_tokens=16)
ASKED = [{"role": "user", "content": "Tell me about lighthouses."}]


@pytest.fixture(scope="module")
def tiny_engine(loop_thread: LoopThread) -> Iterator[VllmEngine]:
    """vLLM's engine on the tiny model, at the test engine's settings (eager, float32)."""
    from gateway.engine.vllm_engine import VllmEngine

    model = tiny_llama_dir()
    settings = gateway_settings(MODEL=str(model), SERVED_MODEL_NAME="tiny-llama").engine
    built = loop_thread.run(VllmEngine.start(settings, str(model)))
    yield built
    loop_thread.call(built.shutdown)


def greedy(loop_thread: LoopThread, engine: VllmEngine) -> tuple[list[int], str]:
    prompt = engine.encode(engine.render_chat(ASKED))
    (step,) = loop_thread.run(engine.complete(prompt, GREEDY))
    return list(step.token_ids), step.text


def test_the_same_seed_builds_the_same_model(tmp_path: Path) -> None:
    from gateway.engine.default_model import prepare_default_model

    default = prepare_default_model()
    first = make_tiny_llama(default, tmp_path / "first")
    again = make_tiny_llama(default, tmp_path / "again")
    other = make_tiny_llama(default, tmp_path / "other", seed=1)
    names = {p.name for p in first.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors"} <= names
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= names
    for name in names:
        assert (first / name).read_bytes() == (again / name).read_bytes(), name
    weights = "model.safetensors"
    assert (first / weights).read_bytes() != (other / weights).read_bytes()
    assert (first / "tokenizer.json").read_bytes() == (default / "tokenizer.json").read_bytes()


def test_the_tiny_model_answers_the_same_twice_and_not_as_smollm2(
    loop_thread: LoopThread, tiny_engine: VllmEngine, engine: VllmEngine
) -> None:
    assert tiny_engine.vocabulary == engine.vocabulary
    # The same chat template: the same prompt's tokens reach both models.
    assert tiny_engine.render_chat(ASKED) == engine.render_chat(ASKED)
    tokens, text = greedy(loop_thread, tiny_engine)
    assert len(tokens) == GREEDY.max_new_tokens  # this seed's noise: no end of sequence
    assert greedy(loop_thread, tiny_engine) == (tokens, text)
    smollm2_tokens, smollm2_text = greedy(loop_thread, engine)
    assert smollm2_tokens != tokens and smollm2_text != text
