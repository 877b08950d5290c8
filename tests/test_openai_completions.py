"""`/v1/completions` as lm-evaluation-harness and other scorers use it: `echo` with `logprobs`
scores the prompt's tokens too, `max_tokens: 0` scores the prompt alone, and prompts may be
token ids. (tests/test_vllm_parity.py sends the same requests to vLLM's own server.)"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from clients import web
from serving import RunningServer

MODEL = "SmolLM2-135M-Instruct"
PROMPT = "The capital of France is"
PARIS = [504, 3575, 282, 4649, 314]  # PROMPT's tokens
PROMPT_TOKENS = ["The", " capital", " of", " France", " is"]


def complete(server: RunningServer, **body: Any) -> httpx.Response:
    body = {"model": MODEL, "temperature": 0, **body}
    return web.post(server.http + "/v1/completions", json=body)


def choices(server: RunningServer, **body: Any) -> list[dict[str, Any]]:
    answer = complete(server, **body)
    assert answer.status_code == 200, answer.text
    found: list[dict[str, Any]] = answer.json()["choices"]
    return found


def test_echo_with_logprobs_scores_the_prompt_and_the_text(server: RunningServer) -> None:
    [echoed] = choices(server, prompt=PROMPT, max_tokens=2, echo=True, logprobs=1)
    [plain] = choices(server, prompt=PROMPT, max_tokens=2, logprobs=1)
    assert echoed["text"] == PROMPT + plain["text"]
    logprobs = echoed["logprobs"]
    assert logprobs["tokens"] == PROMPT_TOKENS + plain["logprobs"]["tokens"]
    # The first token has no log-probability (nothing comes before it), the others have.
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert all(lp <= 0 for lp in logprobs["token_logprobs"][1:])
    assert logprobs["token_logprobs"][5:] == plain["logprobs"]["token_logprobs"]
    for token, top in zip(logprobs["tokens"][1:], logprobs["top_logprobs"][1:], strict=True):
        assert token in top and 1 <= len(top) <= 2  # the chosen token, and the best one
    # Offsets into the echoed text.
    offsets = logprobs["text_offset"]
    assert offsets[:3] == [0, 3, 11]
    for token, at in zip(logprobs["tokens"], offsets, strict=True):
        assert echoed["text"][at : at + len(token)] == token


def test_max_tokens_0_with_echo_scores_the_prompt_alone(server: RunningServer) -> None:
    answer = complete(server, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
    assert answer.status_code == 200, answer.text
    [choice] = answer.json()["choices"]
    assert choice["text"] == PROMPT and choice["logprobs"]["tokens"] == PROMPT_TOKENS
    assert answer.json()["usage"]["completion_tokens"] == 0
    refused = complete(server, prompt=PROMPT, max_tokens=0)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens"


def test_a_streamed_echo_comes_whole(server: RunningServer) -> None:
    body = {
        "model": MODEL,
        "prompt": PROMPT,
        "temperature": 0,
        "max_tokens": 3,
        "echo": True,
        "logprobs": 1,
    }
    [whole] = choices(server, **{k: v for k, v in body.items() if k != "model"})
    events: list[dict[str, Any]] = []
    with web.stream(
        "POST", server.http + "/v1/completions", json={**body, "stream": True}
    ) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line.removeprefix("data: ")))
    [chunk] = [c for e in events for c in e["choices"]]
    assert chunk["text"] == whole["text"] and chunk["logprobs"] == whole["logprobs"]
    assert chunk["finish_reason"] == whole["finish_reason"]


def test_token_id_prompts_answer_as_their_text_does(server: RunningServer) -> None:
    api = openai.OpenAI(base_url=server.http + "/v1", api_key="unused", max_retries=0)
    as_text = api.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=4)
    as_ids = api.completions.create(model=MODEL, prompt=PARIS, temperature=0, max_tokens=4)
    assert as_ids.choices[0].text == as_text.choices[0].text
    assert as_ids.usage is not None and as_ids.usage.prompt_tokens == len(PARIS)
    # A list of token lists: one prompt each, echoed as the tokenizer spells it.
    both = choices(server, prompt=[PARIS, PARIS[:2]], max_tokens=0, echo=True, logprobs=1)
    assert [c["text"] for c in both] == [PROMPT, "The capital"]
    assert both[1]["logprobs"]["token_logprobs"] == both[0]["logprobs"]["token_logprobs"][:2]


def test_token_ids_outside_the_vocabulary_are_refused(server: RunningServer) -> None:
    def refused(prompt: Any) -> dict[str, Any]:
        answer = complete(server, prompt=prompt, max_tokens=1)
        assert answer.status_code == 400, answer.text
        error: dict[str, Any] = answer.json()["error"]
        assert error["type"] == "invalid_request_error"
        return error

    out = refused([504, 10**6])
    assert out["param"] == "prompt[1]" and "out of vocabulary" in out["message"]
    assert refused([PARIS, [504, 3575, 282, 49152]])["param"] == "prompt[1][3]"
    assert refused([504, -1])["param"] == "prompt[1]"
    assert refused([504, "Paris"])["param"] == "prompt"  # ids and text mixed
    assert refused([])["param"] == "prompt"


def test_a_seeded_prompt_longer_than_a_step_samples_and_repeats(server: RunningServer) -> None:
    # Prefilled in chunks (a CPU step takes 512 tokens): each chunk's sampled token is discarded,
    # and vLLM's rewind of the request's generator used to kill a CPU worker.
    prompt = "The quick brown fox jumps over the lazy dog. " * 80
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 1.0, "seed": 7}
    first, second = complete(server, **body), complete(server, **body)
    assert first.status_code == second.status_code == 200, first.text
    assert first.json()["usage"]["prompt_tokens"] > 512
    assert first.json()["choices"][0]["text"] == second.json()["choices"][0]["text"]
    assert choices(server, prompt=PROMPT, max_tokens=2)[0]["text"]  # the engine still serves


def test_a_logit_bias_id_outside_the_vocabulary_is_refused_naming_logit_bias(
    server: RunningServer,
) -> None:
    """OpenAI's 400 with `param`, on both routes, before the engine sees it (vLLM's own check
    would be an unprocessable request); the SDK raises its BadRequestError."""
    client = openai.OpenAI(base_url=server.http + "/v1", api_key="-", max_retries=0)
    with pytest.raises(openai.BadRequestError) as chat:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=1,
            logit_bias={"49152": 5},
        )
    with pytest.raises(openai.BadRequestError) as completion:
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=1, logit_bias={"49152": 5})
    for refused in (chat.value, completion.value):
        error = refused.body
        assert isinstance(error, dict) and error["param"] == "logit_bias", error
        assert error["type"] == "invalid_request_error"
    biased = client.completions.create(
        model=MODEL, prompt="Hi", max_tokens=1, logit_bias={"49151": -5}
    )
    assert biased.usage is not None and biased.usage.completion_tokens == 1
