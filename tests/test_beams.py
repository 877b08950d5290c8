"""Beam search answers as transformers' `generate(num_beams=...)` does, on every protocol."""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from clients import CHAT, events_of, payload, run_ws, web
from gateway.engine.beams import beam_search
from serving import RunningServer

if TYPE_CHECKING:
    from gateway.engine.vllm_engine import VllmEngine

PROMPTS = [
    "What is Deep Learning?",
    CHAT.format("What is the capital of France?"),
    CHAT.format("Write a haiku about the sea."),
]
NEW_TOKENS = 16


def search(table: dict[tuple[int, ...], dict[int, float]], **options: Any) -> list[Any]:
    """Beam search over a fixed table: the next tokens' log-probabilities after each prefix."""

    async def next_tokens(sequences: list[list[int]], count: int) -> list[dict[int, float]]:
        return [table[tuple(s)] for s in sequences]

    defaults: dict[str, Any] = {"num_beams": 2, "max_new_tokens": 8, "eos_token_ids": {0}}
    return asyncio.run(beam_search([], next_tokens, **(defaults | options)))


# After the prompt, ending at once (token 0) is likelier than any one word; the sentence
# 1, 2, 3, then the end is far likelier per token.
TABLE = {
    (): {0: -0.9, 1: -1.0, 5: -3.0},
    (1,): {2: -0.05, 0: -4.0, 5: -5.0},
    (5,): {0: -0.5, 6: -2.0, 7: -3.0},
    (1, 2): {3: -0.05, 0: -4.0, 6: -6.0},
    (5, 6): {0: -1.0, 7: -2.0, 8: -3.0},
    (1, 2, 3): {0: -0.05, 4: -4.0, 6: -6.0},
    (5, 6, 0): {},
    (1, 2, 3, 4): {0: -1.0, 8: -1.0},
    (5, 6, 7): {0: -1.0, 8: -1.0},
}


def test_the_best_beam_is_scored_over_its_own_length() -> None:
    best, second = search(TABLE)
    assert best.token_ids == (1, 2, 3, 0) and best.ended_at_eos
    assert best.score == pytest.approx((-1.0 - 0.05 * 3) / 4)
    assert second.token_ids == (0,) and second.score == pytest.approx(-0.9)
    # Each token keeps the model's own log-probability, even when beams are sampled.
    assert best.logprobs == (-1.0, -0.05, -0.05, -0.05) and second.logprobs == (-0.9,)
    sampled = search(TABLE, temperature=0.5, seed=3)
    for hypothesis in sampled:
        prefixes = [hypothesis.token_ids[:k] for k in range(len(hypothesis.token_ids))]
        expected = [TABLE[p][t] for p, t in zip(prefixes, hypothesis.token_ids, strict=True)]
        assert list(hypothesis.logprobs) == expected
    # A strong length penalty below 0 favours the short one, as in transformers.
    assert search(TABLE, length_penalty=-2.0)[0].token_ids == (0,)


def test_early_stopping_ends_as_soon_as_num_beams_are_finished() -> None:
    # After two tokens, (0,) and (5, 0) are finished, and (5, 9) runs on: it can still win.
    table = {(): {0: -0.1, 5: -0.2, 9: -5.0}, (5,): {9: -0.05, 0: -0.1}, (9,): {0: -1.0}}
    table |= {(5, 9): {0: -0.01}}
    assert [h.token_ids for h in search(table, early_stopping=True)] == [(0,), (5, 0)]
    assert [h.token_ids for h in search(table)] == [(5, 9, 0), (0,)]


def transformers_beams(engine: VllmEngine, prompt: str) -> str:
    """The same search by transformers itself, on the default model, in the engine's dtype."""
    import torch
    from transformers import AutoModelForCausalLM

    from gateway.engine.default_model import prepare_default_model

    dtype = getattr(torch, engine.dtype)
    model: Any = AutoModelForCausalLM.from_pretrained(str(prepare_default_model()), dtype=dtype)
    ids = torch.tensor([engine.encode(prompt)])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            num_beams=2,
            do_sample=False,
            max_new_tokens=NEW_TOKENS,
            length_penalty=1.0,
            early_stopping=False,
        )
    return engine.decode(out[0, ids.shape[1] :].tolist()).replace("<|im_end|>", "")


# One prompt in `make test`; the two slowest (transformers' own beam search on the CPU) in
# `make test-all`: the same comparison on other text.
LONG = pytest.mark.long


@pytest.mark.parametrize(
    "prompt",
    [
        pytest.param(PROMPTS[0], id="raw", marks=LONG),
        pytest.param(PROMPTS[1], id="capital"),
        pytest.param(PROMPTS[2], id="haiku", marks=LONG),
    ],
)
def test_beams_answer_what_transformers_answers(server: RunningServer, prompt: str) -> None:
    from gateway.engine.vllm_engine import VllmEngine

    engine = server.gateway.service.holder.engine
    assert isinstance(engine, VllmEngine)
    expected = transformers_beams(engine, prompt)
    assert expected.strip()
    config = {"num_beams": 2, "do_sample": False, "max_new_tokens": NEW_TOKENS}
    one = web.post(
        server.http + "/api/generate-one",
        json={"request_id": uuid.uuid4().hex, "prompt": prompt, "stream_response": False}
        | {"generation_config": config},
    )
    assert one.status_code == 200 and one.text == expected
    lmi = web.post(
        server.http + "/invocations",
        json={"inputs": prompt, "parameters": config | {"details": True}},
    )
    assert lmi.status_code == 200 and lmi.json()["generated_text"] == expected
    rid = uuid.uuid4().hex
    message = payload((rid, prompt), stream_response=False, generation_config=config)
    complete = events_of(run_ws(server.ws, message, {rid}), rid)[-1]
    assert complete["type"] == "COMPLETE" and complete["text"] == expected
    assert complete["is_eos"] is expected.endswith(".")  # the capital's answer ends itself
