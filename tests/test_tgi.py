"""TGI's native routes on the real engine, with huggingface_hub's InferenceClient and httpx."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import OverloadedError, ValidationError

from clients import CHAT, UNENDING, outcomes_since, settled_metrics, web
from serving import RunningServer

PROMPT = CHAT.format("Name three colours.")
SHORT = CHAT.format("What is 2+2? Answer with a number only.")  # greedy: "2 + 2 = 4", then EOS
ESSAY = CHAT.format("Write a very long essay about rivers.")  # greedy: hundreds of tokens
FOREVER = {"max_new_tokens": UNENDING, "ignore_eos_token": True}  # ends only when stopped


def client(server: RunningServer) -> InferenceClient:
    return InferenceClient(base_url=server.http)


def post(server: RunningServer, path: str, **body: Any) -> httpx.Response:
    return web.post(server.http + path, json=body)


def sse(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.headers["content-type"].startswith("text/event-stream")
    chunks = [c for c in response.text.split("\n\n") if c]
    assert all(c.startswith("data: ") and "\n" not in c for c in chunks), chunks
    return [json.loads(c.removeprefix("data: ")) for c in chunks]


def test_text_generation_with_and_without_stream(server: RunningServer) -> None:
    tgi = client(server)
    # POST / answers the full text by default, as TGI does for a text-generation model.
    full = tgi.text_generation(SHORT, max_new_tokens=20)
    assert full == SHORT + "2 + 2 = 4"
    new = tgi.text_generation(SHORT, max_new_tokens=20, return_full_text=False)
    assert new == "2 + 2 = 4"
    pieces = list(tgi.text_generation(PROMPT, max_new_tokens=8, stream=True))
    assert len(pieces) > 1
    assert "".join(pieces) == tgi.text_generation(PROMPT, max_new_tokens=8, return_full_text=False)


def test_details_tokens_prefill_and_top_tokens(server: RunningServer) -> None:
    tgi = client(server)
    out = tgi.text_generation(
        SHORT,
        max_new_tokens=20,
        details=True,
        decoder_input_details=True,
        top_n_tokens=2,
        return_full_text=False,
    )
    details = out.details
    assert details is not None and out.generated_text == "2 + 2 = 4"
    assert (details.finish_reason, details.generated_tokens) == ("eos_token", 8)
    assert details.tokens[-1].special and details.tokens[-1].text == "<|im_end|>"
    assert all(t.logprob < 0 for t in details.tokens) and not details.tokens[0].special
    assert details.prefill[0].logprob is None and len(details.prefill) > 5
    assert details.top_tokens is not None and len(details.top_tokens) == 8
    assert all(len(top) == 2 for top in details.top_tokens)
    assert details.top_tokens[0][0]["id"] == details.tokens[0].id  # greedy took the best
    stopped = tgi.text_generation(SHORT, max_new_tokens=20, details=True, stop=[" = "])
    assert stopped.details is not None and stopped.details.finish_reason == "stop_sequence"
    length = tgi.text_generation(PROMPT, max_new_tokens=3, details=True)
    assert length.details is not None and length.details.finish_reason == "length"
    past_eos = post(
        server,
        "/generate",
        inputs=SHORT,
        parameters={"max_new_tokens": 12, "ignore_eos_token": True, "details": True},
    )
    assert past_eos.json()["details"]["generated_tokens"] == 12


def test_stream_with_details_ends_with_text_and_details(server: RunningServer) -> None:
    tgi = client(server)  # kept: the client owns the stream's connection
    events = list(tgi.text_generation(PROMPT, max_new_tokens=5, stream=True, details=True))
    assert [e.index for e in events] == [1, 2, 3, 4, 5]
    assert all(e.generated_text is None and e.details is None for e in events[:-1])
    last = events[-1]
    assert last.details is not None and last.details.finish_reason == "length"
    assert last.details.generated_tokens == 5 and last.details.input_length > 5
    assert last.generated_text == PROMPT + "".join(e.token.text for e in events)


def test_generate_and_generate_stream_shapes(server: RunningServer) -> None:
    body: dict[str, Any] = {"inputs": PROMPT, "parameters": {"max_new_tokens": 4}}
    whole = post(server, "/generate", **body)
    assert whole.status_code == 200 and whole.json() == {
        "generated_text": whole.json()["generated_text"]
    }
    events = sse(post(server, "/generate_stream", **body))
    assert [e["index"] for e in events] == [1, 2, 3, 4]
    assert events[0]["generated_text"] is None and events[0]["details"] is None
    assert set(events[0]["token"]) == {"id", "text", "logprob", "special"}
    assert events[-1]["generated_text"] == whole.json()["generated_text"]
    assert "details" in events[-1] and events[-1]["details"] is None  # not asked for
    listed = post(server, "/", **body)
    assert listed.json() == [{"generated_text": PROMPT + whole.json()["generated_text"]}]
    streamed = sse(post(server, "/", stream=True, **body))
    assert [e["token"]["id"] for e in streamed] == [e["token"]["id"] for e in events]


def test_sampling_and_best_of(server: RunningServer) -> None:
    tgi = client(server)
    greedy = tgi.text_generation(PROMPT, max_new_tokens=8, return_full_text=False)
    assert tgi.text_generation(PROMPT, max_new_tokens=8, top_k=1, seed=5) == PROMPT + greedy
    sampled = tgi.text_generation(PROMPT, max_new_tokens=8, temperature=1.5, seed=9)
    assert sampled == tgi.text_generation(PROMPT, max_new_tokens=8, temperature=1.5, seed=9)
    best = tgi.text_generation(
        PROMPT, max_new_tokens=5, best_of=2, do_sample=True, details=True, return_full_text=False
    )
    assert best.details is not None and best.details.best_of_sequences is not None
    [other] = best.details.best_of_sequences
    mean = sum(t.logprob for t in best.details.tokens) / len(best.details.tokens)
    assert mean >= sum(t.logprob for t in other.tokens) / len(other.tokens)
    truncated = tgi.text_generation(
        PROMPT, max_new_tokens=2, truncate=3, details=True, decoder_input_details=True
    )
    assert truncated.details is not None and len(truncated.details.prefill) == 3


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"temperature": 0.0}, "temperature"),
        ({"top_p": 1.0}, "top_p"),
        ({"watermark": True}, "watermark"),
        ({"best_of": 2}, "best_of"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ],
)
def test_validation_errors_reach_the_client(
    server: RunningServer, params: dict[str, Any], words: str
) -> None:
    tgi = client(server)
    with pytest.raises(ValidationError, match=words):
        tgi.text_generation(PROMPT, max_new_tokens=2, **params)
    with pytest.raises(ValidationError, match=words):
        list(tgi.text_generation(PROMPT, max_new_tokens=2, stream=True, **params))


def test_generation_config_fields_vllm_lacks_are_accepted_and_ignored(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    greedy = client(server).text_generation(SHORT, max_new_tokens=8, return_full_text=False)
    epsilon = post(
        server, "/generate", inputs=SHORT, parameters={"max_new_tokens": 8, "epsilon_cutoff": 0.01}
    )
    # epsilon sampling (transformers') has no TGI parameter: ignored, and logged
    assert epsilon.status_code == 200 and epsilon.json()["generated_text"] == greedy
    assert "epsilon_cutoff" in caplog.text
    unknown = post(server, "/generate", inputs=SHORT, parameters={"typical_q": 0.5})
    assert unknown.status_code == 422 and unknown.json()["error_type"] == "validation"
    assert "typical_q" in unknown.json()["error"]  # named, at the object that holds it
    assert unknown.json()["error"].endswith(" - at `$.parameters`")


def test_error_bodies_and_statuses(server: RunningServer) -> None:
    bad = post(server, "/generate", inputs=PROMPT, parameters={"top_k": 0})
    assert bad.status_code == 422
    assert bad.json()["error_type"] == "validation" and "$.parameters.top_k" in bad.json()["error"]
    unknown = post(server, "/generate", inputs=PROMPT, parameters={"nope": 1})
    assert unknown.status_code == 422 and unknown.json()["error_type"] == "validation"
    error = unknown.json()["error"]
    assert error.startswith("Input validation error: ") and "nope" in error
    assert error.endswith(" - at `$.parameters`")
    too_long = post(server, "/generate", inputs="word " * 3000)
    assert too_long.status_code == 422 and "$.inputs" in too_long.json()["error"]
    in_stream = post(server, "/generate_stream", inputs=PROMPT, parameters={"top_k": 0})
    assert in_stream.status_code == 200
    [event] = sse(in_stream)
    assert event["error_type"] == "validation"
    prefill = sse(
        post(server, "/generate_stream", inputs=PROMPT, parameters={"decoder_input_details": True})
    )
    assert "decoder_input_details" in prefill[0]["error"]


def test_overload_raises_overloaded_error(
    make_server: Callable[..., RunningServer], idle_engine: Callable[..., None]
) -> None:
    tight = make_server(MAX_RUNNING_REQUESTS="1", MAX_WAITING_REQUESTS="0")
    with web.stream(
        "POST",
        tight.http + "/generate_stream",
        json={"inputs": ESSAY, "parameters": FOREVER},
    ) as busy:
        received = busy.iter_lines()  # kept: a dropped iterator closes the connection
        next(received)
        with pytest.raises(OverloadedError):
            client(tight).text_generation(PROMPT, max_new_tokens=2)
        refused = post(tight, "/generate", inputs=PROMPT)
        assert refused.status_code == 429 and refused.json()["error_type"] == "overloaded"
    idle_engine()


def test_info_and_health(server: RunningServer) -> None:
    tgi = InferenceClient(base_url=server.http, provider="hf-inference")
    assert tgi.health_check()
    info = tgi.get_endpoint_info()
    assert info["max_total_tokens"] == 2048 and info["max_input_tokens"] == 2047
    assert info["max_best_of"] == 2 and info["max_stop_sequences"] == 4
    assert info["model_id"] and info["model_pipeline_tag"] == "text-generation"


def test_a_client_that_leaves_a_stream_stops_its_generation(
    server: RunningServer, idle_engine: Callable[[], None]
) -> None:
    before = settled_metrics(server.http)
    with client(server) as tgi:
        stream = tgi.text_generation(ESSAY, max_new_tokens=UNENDING, stream=True)
        assert next(iter(stream))
    idle_engine()  # leaving the client's context closed the connection
    after = settled_metrics(server.http)
    assert outcomes_since(before, after, "tgi") == {"cancelled": 1}
    with web.stream(
        "POST",
        server.http + "/generate_stream",
        json={"inputs": ESSAY, "parameters": FOREVER},
    ) as response:
        next(response.iter_lines())
    idle_engine()
    assert outcomes_since(after, settled_metrics(server.http), "tgi") == {"cancelled": 1}
