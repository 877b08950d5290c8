"""The gateway beside vLLM's own OpenAI server, on the same model at the same settings (greedy,
float32, eager, the same context): lm-evaluation-harness, unchanged, scores the same on both,
and the requests it relies on (echo with log-probabilities, token-id prompts, /tokenize,
/detokenize) get the same answers.

The tasks are local (tests/lm_eval_tasks/, JSON lines): nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clients import web
from serving import RunningServer

MODEL = "SmolLM2-135M-Instruct"
TASKS = Path(__file__).parent / "lm_eval_tasks"
PARIS = [504, 3575, 282, 4649, 314]  # "The capital of France is"


def post(url: str, path: str, body: dict[str, Any]) -> Any:
    answer = web.post(url + path, json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_echoed_log_probabilities_match(server: RunningServer, vllm_server: str) -> None:
    """lm_eval's log-likelihood request (token ids, echo, logprobs, one token), and the prompt
    alone (`max_tokens` 0)."""
    for max_tokens in (1, 0):
        body = {
            "model": MODEL,
            "prompt": [PARIS, PARIS[:3]],
            "temperature": 0,
            "max_tokens": max_tokens,
            "logprobs": 1,
            "echo": True,
            "seed": 1234,
        }
        ours, theirs = (
            post(server.http, "/v1/completions", body),
            post(vllm_server, "/v1/completions", body),
        )
        for mine, vllms in zip(ours["choices"], theirs["choices"], strict=True):
            assert mine["text"] == vllms["text"]
            for field in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                assert mine["logprobs"][field] == vllms["logprobs"][field], field


def test_tokenize_and_detokenize_match(server: RunningServer, vllm_server: str) -> None:
    requests: list[tuple[str, dict[str, Any]]] = [
        ("/tokenize", {"prompt": "The capital of France is", "return_token_strs": True}),
        ("/tokenize", {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}),
        ("/detokenize", {"tokens": [1, *PARIS, 2]}),
    ]
    for path, body in requests:
        assert post(server.http, path, body) == post(vllm_server, path, body), path


def _evaluate(model: str, url: str, task: str, **model_args: Any) -> dict[str, Any]:
    """lm_eval's own entry point, as its CLI calls it."""
    import lm_eval  # type: ignore[import-untyped]
    from lm_eval.tasks import TaskManager  # type: ignore[import-untyped]

    results = lm_eval.simple_evaluate(
        model=model,
        model_args={"model": MODEL, "base_url": url, **model_args},
        tasks=[task],
        task_manager=TaskManager(include_path=str(TASKS), include_defaults=False),  # ours alone
        apply_chat_template=model == "local-chat-completions",
        log_samples=False,
    )
    assert results is not None
    scores: dict[str, Any] = results["results"][task]
    return scores


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing fetched: the tasks' data files are local (and relative to their directory)."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(TASKS)


@pytest.mark.usefixtures("offline")
def test_lm_eval_log_likelihood_scores_the_same(server: RunningServer, vllm_server: str) -> None:
    from gateway.engine.default_model import prepare_default_model

    tokenizer = {
        "tokenizer": str(prepare_default_model()),
        "tokenizer_backend": "huggingface",
        "tokenized_requests": True,  # token-id prompts, as lm_eval sends them by default
    }
    scores = [
        _evaluate(
            "local-completions", url + "/v1/completions", "gateway_multiple_choice", **tokenizer
        )
        for url in (server.http, vllm_server)
    ]
    ours, vllms = (s["acc,none"] for s in scores)
    assert ours == vllms and ours > 0.25  # above chance: four choices each


@pytest.mark.usefixtures("offline")
def test_lm_eval_generation_scores_within_one_item(server: RunningServer, vllm_server: str) -> None:
    scores = [
        _evaluate("local-chat-completions", url + "/v1/chat/completions", "gateway_generation")
        for url in (server.http, vllm_server)
    ]
    items = len((TASKS / "generation.jsonl").read_text().splitlines())
    ours, vllms = (s["named,none"] for s in scores)
    assert abs(ours - vllms) * items <= 1 and ours > 0.5, (ours, vllms)
