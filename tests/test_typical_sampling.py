"""Typical sampling (`typical_p`) on TGI, LMI and `generation_config`: the gateway's vLLM logits
processor (gateway/engine/typical_sampling.py) against transformers' own warpers."""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

import pytest
from huggingface_hub import InferenceClient

from clients import CHAT, web
from serving import RunningServer

if TYPE_CHECKING:
    import torch

    from gateway.engine.vllm_engine import VllmEngine

PROMPT = CHAT.format("Tell me a story about a lighthouse keeper.")
NEW_TOKENS = 24


def _transformers_warped(scores: torch.Tensor, **given: Any) -> torch.Tensor:
    """transformers' warpers for these fields, in the order its `generate` applies them
    (temperature, top-k, top-p, min-p, typical: GenerationMixin's logits processor list)."""
    from transformers import (
        LogitsProcessorList,
        MinPLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
        TypicalLogitsWarper,
    )

    warpers: Any = LogitsProcessorList()
    if given.get("top_k"):
        warpers.append(TopKLogitsWarper(top_k=given["top_k"]))
    if given.get("top_p", 1.0) < 1.0:
        warpers.append(TopPLogitsWarper(top_p=given["top_p"]))
    if given.get("min_p"):
        warpers.append(MinPLogitsWarper(min_p=given["min_p"]))
    warpers.append(TypicalLogitsWarper(mass=given["typical_p"]))
    warped: torch.Tensor = warpers(None, scores)
    return warped


@pytest.mark.engine  # imports vLLM (the processor is vLLM's kind): not `make test-fast`'s
@pytest.mark.parametrize(
    "given",
    [
        {"typical_p": 0.2},
        {"typical_p": 0.9, "top_k": 40},
        {"typical_p": 0.5, "top_p": 0.8},
        {"typical_p": 0.7, "top_k": 100, "top_p": 0.9, "min_p": 0.05},
    ],
)
def test_the_filters_remove_what_transformers_warpers_remove(given: dict[str, Any]) -> None:
    import torch

    from gateway.engine.typical_sampling import Filters, filtered

    generator = torch.Generator().manual_seed(7)
    for _ in range(20):
        scores = torch.randn(1, 49_152, generator=generator) * 4
        ours = filtered(scores.clone(), Filters(**({"top_k": 0} | given)))
        theirs = _transformers_warped(scores.clone(), **({"top_k": 0} | given))
        assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
        assert int((~torch.isinf(ours)).sum()) < scores.shape[-1]  # something was removed


def _typical_sets(engine: VllmEngine, prompt_ids: list[int], answer: list[int]) -> list[set[int]]:
    """After each prefix of `answer`: the tokens transformers' typical warper keeps at mass
    0.2, computed afresh on the default model (one forward pass)."""
    import torch
    from transformers import AutoModelForCausalLM

    from gateway.engine.default_model import prepare_default_model

    model: Any = AutoModelForCausalLM.from_pretrained(
        str(prepare_default_model()), dtype=getattr(torch, engine.dtype)
    )
    ids = torch.tensor([prompt_ids + answer])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
    kept = _transformers_warped(logits, typical_p=0.2, top_k=0)
    return [set(torch.nonzero(~torch.isinf(row)).flatten().tolist()) for row in kept]


# `make test-all` only (issue 55: `make test`'s time on the slowest CPU); the processor's own test
# stays in `make test`.
@pytest.mark.long
def test_tgi_lmi_and_generation_config_sample_from_the_typical_set(
    server: RunningServer, engine: VllmEngine
) -> None:
    hub = InferenceClient(server.http)
    first = hub.text_generation(
        PROMPT,
        max_new_tokens=NEW_TOKENS,
        typical_p=0.2,
        seed=11,
        details=True,
        return_full_text=False,
    )
    assert first.details is not None
    answer = [t.id for t in first.details.tokens]
    assert len(answer) >= NEW_TOKENS // 2
    # Each token is in the typical set transformers computes after the tokens before it, while
    # plain sampling leaves it most of the time (a typical set at 0.2 holds few tokens).
    sets = _typical_sets(engine, engine.encode(PROMPT), answer)
    assert all(token in kept for token, kept in zip(answer, sets, strict=True))
    assert sum(len(kept) for kept in sets) < 20 * NEW_TOKENS
    # The same request on LMI and on `generation_config`: the same seeded draws, the same text.
    lmi = web.post(
        server.http + "/invocations",
        json={
            "inputs": PROMPT,
            "parameters": {
                "do_sample": True,
                "typical_p": 0.2,
                "seed": 11,
                "max_new_tokens": NEW_TOKENS,
            },
        },
    )
    assert lmi.status_code == 200, lmi.text
    assert lmi.json()["generated_text"] == first.generated_text
    config = {"do_sample": True, "typical_p": 0.2, "top_k": 0, "seed": 11}
    one = web.post(
        server.http + "/api/generate-one",
        json={
            "request_id": uuid.uuid4().hex,
            "prompt": PROMPT,
            "stream_response": False,
            "generation_config": config | {"max_new_tokens": NEW_TOKENS},
        },
    )
    assert one.status_code == 200 and one.text == first.generated_text


def test_typical_p_out_of_range_is_refused_naming_it(server: RunningServer) -> None:
    tgi = web.post(
        server.http + "/generate", json={"inputs": "Hi", "parameters": {"typical_p": 1.0}}
    )
    assert tgi.status_code == 422 and "typical_p" in tgi.json()["error"]
    lmi = web.post(
        server.http + "/invocations", json={"inputs": "Hi", "parameters": {"typical_p": 0}}
    )
    assert lmi.status_code == 424 and "typical_p" in lmi.text


def test_without_the_processor_typical_p_is_ignored_and_logged(
    server: RunningServer, engine: VllmEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """TYPICAL_SAMPLING off (a GPU's default): the engine samples as if typical_p were not
    given, and says so in the log. On this CPU it is on (`auto`)."""
    assert engine.typical_sampling
    caplog.set_level(logging.WARNING, logger="gateway.engine.vllm_engine")

    def text(**given: Any) -> str:
        parameters = {"do_sample": True, "seed": 5, "max_new_tokens": 12} | given
        body = {"inputs": PROMPT, "parameters": parameters}
        answer = web.post(server.http + "/invocations", json=body)
        assert answer.status_code == 200, answer.text
        return str(answer.json()["generated_text"])

    plain = text()
    assert text(typical_p=0.2) != plain  # honoured
    engine.typical_sampling = False
    try:
        assert text(typical_p=0.2) == plain
    finally:
        engine.typical_sampling = True
    assert "typical_p ignored: TYPICAL_SAMPLING is off" in caplog.text
