"""POST `/invocations` and `/predictions/{model}` (the LMI schema): real engine, httpx."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from clients import (
    CHAT,
    UNENDING,
    ended_since,
    leaving_client,
    outcomes_since,
    settled_metrics,
    wait_for,
    wait_ready,
    web,
)
from serving import (
    LoopThread,
    RunningServer,
    failing_loader,
    gateway_settings,
    loading_server,
    start_server,
)

if TYPE_CHECKING:
    from gateway.engine.vllm_engine import VllmEngine

PROMPT = CHAT.format("Name three colours.")
FAULT = CHAT.format("Fail in the engine, please.")  # fails once admitted (serving.failing_loader)
SHORT = CHAT.format("What is 2+2? Answer with a number only.")  # greedy: "2 + 2 = 4", then EOS
REPEATS = "Hello"
LONG = {"max_new_tokens": UNENDING, "ignore_eos_token": True}


def invoke(server: RunningServer, body: dict[str, Any], **kwargs: Any) -> httpx.Response:
    return web.post(server.http + "/invocations", json=body, **kwargs)


def lines(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line) for line in response.text.splitlines() if line]


def events(response: httpx.Response) -> list[dict[str, Any]]:
    chunks = [c for c in response.text.split("\n\n") if c]
    assert all(c.startswith("data: ") and "\n" not in c for c in chunks), chunks
    return [json.loads(c.removeprefix("data: ")) for c in chunks]


def same_tokens(a: list[dict[str, Any]], b: list[dict[str, Any]], logprob: str) -> bool:
    """Same ids and texts; log-probabilities equal up to float noise (prefix cache on or off)."""
    return [(t["id"], t["text"]) for t in a] == [(t["id"], t["text"]) for t in b] and all(
        math.isclose(x[logprob], y[logprob], abs_tol=1e-3) for x, y in zip(a, b, strict=True)
    )


def details_of(server: RunningServer, prompt: str, **params: Any) -> dict[str, Any]:
    response = invoke(server, {"inputs": prompt, "parameters": {"details": True, **params}})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_rolling_batch_answers_generated_text_with_real_details(server: RunningServer) -> None:
    plain = invoke(server, {"inputs": PROMPT, "parameters": {"max_new_tokens": 6}})
    assert plain.status_code == 200 and plain.headers["content-type"] == "application/json"
    assert list(plain.json()) == ["generated_text"] and plain.json()["generated_text"]
    body = details_of(server, PROMPT, max_new_tokens=6, ignore_eos_token=True)
    details = body["details"]
    assert body["generated_text"] == plain.json()["generated_text"]  # greedy by default
    assert (details["finish_reason"], details["generated_tokens"], details["inputs"]) == (
        "length",
        6,
        PROMPT,
    )
    assert len(details["tokens"]) == 6
    assert "".join(t["text"] for t in details["tokens"]) == body["generated_text"]
    assert all(t["log_prob"] < 0 and isinstance(t["id"], int) for t in details["tokens"])
    predictions = web.post(
        server.http + "/predictions/any_model",
        json={"inputs": PROMPT, "parameters": {"max_new_tokens": 6}},
    )
    assert predictions.json() == plain.json()


def test_finish_reasons_and_stop_parameters(server: RunningServer) -> None:
    eos = details_of(server, SHORT, max_new_tokens=40)
    assert eos["details"]["finish_reason"] == "eos_token"
    assert eos["details"]["tokens"][-1]["special_token"] is True
    ignored = details_of(server, SHORT, max_new_tokens=12, ignore_eos_token=True)
    assert ignored["details"]["finish_reason"] == "length"
    assert ignored["details"]["generated_tokens"] == 12
    raw = details_of(
        server, SHORT, max_new_tokens=12, ignore_eos_token=True, skip_special_tokens=False
    )
    assert "<|im_end|>" in raw["generated_text"]
    stopped = details_of(server, SHORT, max_new_tokens=40, stop_sequences=[" = "])
    assert stopped["details"]["finish_reason"] == "stop_sequence"
    assert stopped["generated_text"] == "2 + 2"
    kept = details_of(
        server, SHORT, max_new_tokens=40, stop_sequences=[" = "], include_stop_str_in_output=True
    )
    assert kept["generated_text"] == "2 + 2 = "
    third = eos["details"]["tokens"][2]["id"]
    by_id = details_of(server, SHORT, max_new_tokens=40, stop_token_ids=[third])
    assert by_id["details"]["finish_reason"] == "stop_sequence"
    assert by_id["details"]["generated_tokens"] == 3


def test_max_new_tokens_defaults_to_30_and_is_configurable(
    server: RunningServer, make_server: Callable[..., RunningServer]
) -> None:
    default = details_of(server, PROMPT, ignore_eos_token=True)
    assert default["details"]["generated_tokens"] == 30
    five = make_server(LMI_MAX_NEW_TOKENS="5")
    assert details_of(five, PROMPT, ignore_eos_token=True)["details"]["generated_tokens"] == 5


# `make test-all` only (issue 55: `make test`'s time on the slowest CPU); LMI's parameters'
# mapping stays in `make test` (test_lmi_codecs.py).
@pytest.mark.long
def test_sampling_parameters_reach_the_engine(server: RunningServer) -> None:
    greedy = details_of(server, PROMPT, max_new_tokens=12)["generated_text"]

    def text(prompt: str = PROMPT, **params: Any) -> str:
        params.setdefault("max_new_tokens", 12)
        return str(details_of(server, prompt, **params)["generated_text"])

    # Filters that leave only the most likely token make sampling greedy.
    assert text(do_sample=True, top_k=1, seed=3) == greedy
    assert text(do_sample=True, min_p=1.0, seed=3) == greedy
    assert text(do_sample=True, top_p=0.001, seed=3) == greedy
    assert text(do_sample=True, temperature=0) == greedy
    # Sampling is off unless do_sample is set (LMI 0.31), and a seed makes it reproducible.
    assert text(temperature=1.5) == greedy
    first = text(do_sample=True, temperature=1.5, seed=11)
    assert first == text(do_sample=True, temperature=1.5, seed=11)
    assert {first, text(do_sample=True, temperature=1.5, seed=12)} != {greedy}
    # Greedy on a bare prompt repeats itself ("-by-date-but-not-yet-...-date-..."); each
    # penalty changes that.
    repeats = text(REPEATS, max_new_tokens=20)
    for penalty in ("repetition_penalty", "presence_penalty", "frequency_penalty"):
        assert text(REPEATS, max_new_tokens=20, **{penalty: 2.0}) != repeats, penalty


def test_return_full_text_prefill_truncate_and_logprobs(server: RunningServer) -> None:
    full = details_of(server, PROMPT, max_new_tokens=4, return_full_text=True)
    assert full["generated_text"].startswith(PROMPT) and len(full["generated_text"]) > len(PROMPT)
    prefill = details_of(server, PROMPT, max_new_tokens=2, decoder_input_details=True)
    tokens = prefill["details"]["prefill"]
    assert tokens[0]["log_prob"] is None and all(t["log_prob"] < 0 for t in tokens[1:])
    assert "".join(t["text"] for t in tokens) == PROMPT
    cut = details_of(server, PROMPT, max_new_tokens=2, decoder_input_details=True, truncate=4)
    kept = cut["details"]["prefill"]
    assert [t["id"] for t in kept] == [t["id"] for t in tokens[-4:]]
    assert kept[0]["log_prob"] is None  # the first token the model saw
    top = details_of(server, PROMPT, max_new_tokens=3, logprobs=3)
    for token in top["details"]["tokens"]:
        alternatives = token["top_tokens"]
        assert len(alternatives) == 3 and alternatives[0]["id"] == token["id"]  # greedy: the best
        assert alternatives[0]["log_prob"] == token["log_prob"]
        assert [a["log_prob"] for a in alternatives] == sorted(
            (a["log_prob"] for a in alternatives), reverse=True
        )
    ranked = details_of(server, PROMPT, max_new_tokens=2, prompt_logprobs=2)
    assert len(ranked["details"]["prefill"]) == len(tokens)


def test_n_best_of_and_beam_search_return_best_of_sequences(
    server: RunningServer, make_server: Callable[..., RunningServer]
) -> None:
    three = details_of(server, PROMPT, max_new_tokens=5, do_sample=True, n=3, seed=1)
    others = three["details"]["best_of_sequences"]
    assert len(others) == 2
    assert {"finish_reason", "generated_tokens", "tokens", "generated_text"} <= set(others[0])

    def total(tokens: list[dict[str, Any]]) -> float:
        return math.fsum(t["log_prob"] for t in tokens)

    best = total(three["details"]["tokens"])
    assert all(best >= total(o["tokens"]) for o in others)
    # DJL's "best_of=4 and n=3": past TGI's max_best_of (2), MAX_BEST_OF's default.
    wide = make_server(MAX_BEST_OF="3")
    best_of = details_of(wide, PROMPT, max_new_tokens=5, do_sample=True, best_of=3, n=2)
    assert len(best_of["details"]["best_of_sequences"]) == 1
    beams = details_of(server, PROMPT, max_new_tokens=5, num_beams=3)
    assert len(beams["details"]["best_of_sequences"]) == 2
    assert "".join(t["text"] for t in beams["details"]["tokens"]) == beams["generated_text"]
    # Each beam token has the model's log-probability; a beam's score is their mean
    # (length_penalty 1), by which the beams come best first.
    sequences = [beams["details"], *beams["details"]["best_of_sequences"]]
    means = [total(s["tokens"]) / len(s["tokens"]) for s in sequences]
    assert means == sorted(means, reverse=True) and all(m < 0 for m in means), means
    first = beams["details"]["tokens"][0]
    alone = details_of(server, PROMPT, max_new_tokens=1, logprobs=20)["details"]["tokens"][0]
    scored = {top["id"]: top["log_prob"] for top in alone["top_tokens"]}
    assert math.isclose(first["log_prob"], scored[first["id"]], abs_tol=1e-3), (first, scored)


def test_jsonlines_stream_one_token_a_line_then_text_and_details(server: RunningServer) -> None:
    params = {"max_new_tokens": 8, "ignore_eos_token": True, "details": True}
    whole = invoke(server, {"inputs": PROMPT, "parameters": params}).json()
    with web.stream(
        "POST",
        server.http + "/invocations",
        json={"inputs": PROMPT, "stream": True, "parameters": params},
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/jsonlines"
        received = [json.loads(line) for line in response.iter_lines() if line]
    assert len(received) == 8
    assert all(set(line) == {"token"} for line in received[:-1])
    assert same_tokens([line["token"] for line in received], whole["details"]["tokens"], "log_prob")
    last = received[-1]
    assert last["generated_text"] == whole["generated_text"]
    assert last["details"] == {"finish_reason": "length", "generated_tokens": 8, "inputs": PROMPT}


def test_sse_by_accept_header_and_by_configuration(
    server: RunningServer, make_server: Callable[..., RunningServer]
) -> None:
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 4}}
    by_accept = invoke(server, body, headers={"Accept": "text/event-stream"})
    assert by_accept.headers["content-type"].startswith("text/event-stream")
    received = events(by_accept)
    assert len(received) == 4 and "generated_text" in received[-1]
    configured = make_server(OPTION_OUTPUT_FORMATTER="sse")
    assert events(invoke(configured, body)) == received
    streamed_lines = invoke(server, {**body, "stream": True})
    assert lines(streamed_lines) == received


def test_tgi_compat_mode(make_server: Callable[..., RunningServer]) -> None:
    compat = make_server(OPTION_TGI_COMPAT="true")
    params = {"max_new_tokens": 4, "ignore_eos_token": True}
    whole = invoke(compat, {"inputs": PROMPT, "parameters": params}).json()
    assert isinstance(whole, list) and len(whole) == 1
    details = whole[0]["details"]  # on by default in TGI mode
    assert set(details["tokens"][0]) == {"id", "text", "logprob", "special"}
    streamed = invoke(compat, {"inputs": PROMPT, "stream": True, "parameters": params})
    assert streamed.headers["content-type"].startswith("text/event-stream")
    received = events(streamed)
    assert same_tokens([e["token"] for e in received], details["tokens"], "logprob")
    assert received[-1]["generated_text"] == whole[0]["generated_text"]


def test_tgi_client_works_against_invocations_in_tgi_compat_mode(
    make_server: Callable[..., RunningServer],
) -> None:
    from huggingface_hub import InferenceClient

    compat = make_server(OPTION_TGI_COMPAT="true")
    client = InferenceClient(base_url=compat.http + "/invocations")
    text = client.text_generation(PROMPT, max_new_tokens=5)
    pieces = list(client.text_generation(PROMPT, max_new_tokens=5, stream=True))
    assert text and "".join(pieces) == text


def test_dynamic_batch_answers_a_list_and_streams_outputs(server: RunningServer) -> None:
    prompts = [PROMPT, SHORT]
    params = {"max_new_tokens": 6}
    singles = [invoke(server, {"inputs": p, "parameters": params}).json() for p in prompts]
    batch = invoke(server, {"inputs": prompts, "parameters": params})
    assert batch.status_code == 200 and batch.json() == singles
    streamed = invoke(server, {"inputs": prompts, "stream": True, "parameters": params})
    assert streamed.headers["content-type"] == "application/jsonlines"
    outputs = [line["outputs"] for line in lines(streamed)]
    assert all(set(line) == {"outputs"} for line in lines(streamed))
    assert all(len(o) == 2 for o in outputs)
    assert ["".join(o[i] for o in outputs) for i in range(2)] == [
        s["generated_text"] for s in singles
    ]


# `make test-all` only (issue 55: `make test`'s time on the slowest CPU); LMI's parameters'
# mapping stays in `make test` (test_lmi_codecs.py).
@pytest.mark.long
def test_spec_parameters_are_accepted_and_those_vllm_lacks_ignored_with_a_warning(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.routes.lmi")
    epsilon = invoke(server, {"inputs": PROMPT, "parameters": {"epsilon_cutoff": 0.01}})
    assert epsilon.status_code == 200 and epsilon.json()["generated_text"]
    assert "epsilon_cutoff" in caplog.text
    beams = {"num_beams": 2, "early_stopping": True, "max_new_tokens": 8}
    stopped = invoke(server, {"inputs": PROMPT, "parameters": beams})
    assert stopped.status_code == 200 and stopped.json()["generated_text"]


def test_payload_validation_answers_424_naming_the_field(server: RunningServer) -> None:
    # The body, the key its error names, and where the gateway's " - at `...`" places it: the
    # field, or the object that holds an unknown key.
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"inputs": PROMPT, "parameters": {"top_k": "x"}}, "top_k", "$.parameters.top_k"),
        ({"inputs": PROMPT, "parameters": {"do_sample": True, "nn": 2}}, "nn", "$.parameters"),
        ({"input": PROMPT}, "input", "$"),
        ({"inputs": "word " * 3000}, "inputs", "$.inputs"),  # longer than the context
    ]
    for body, name, at in cases:
        response = invoke(server, body)
        assert response.status_code == 424, body
        answer = response.json()
        assert set(answer) == {"error", "code"} and answer["code"] == 424
        assert name in answer["error"] and answer["error"].endswith(f" - at `{at}`"), answer
    not_json = web.post(server.http + "/invocations", content=b"{oops")
    assert not_json.status_code == 424 and "Malformed JSON" in not_json.json()["error"]
    dynamic = invoke(server, {"inputs": [PROMPT, 3]})
    assert dynamic.status_code == 424
    assert dynamic.json()["message"] == "invoke handler failure"
    assert dynamic.json()["code"] == 424 and "$.inputs[1]" in dynamic.json()["error"]
    too_long = invoke(
        server, {"inputs": [PROMPT, "word " * 3000], "parameters": {"max_new_tokens": 2}}
    )
    assert too_long.status_code == 424 and "$.inputs[1]" in too_long.json()["error"]


def test_a_bad_parameter_value_is_answered_as_a_failed_generation(server: RunningServer) -> None:
    # The spec: "an issue with the request (such as bad generation parameter value)" gets the
    # failed generation's body; "an issue with payload validation" gets {"error", "code"}.
    for parameters, field in (
        ({"temperature": -1}, "$.parameters.temperature"),
        ({"max_new_tokens": 0}, "$.parameters.max_new_tokens"),
        ({"num_beams": 2, "stop_sequences": ["x"]}, "$.parameters.stop_sequences"),
    ):
        response = invoke(server, {"inputs": PROMPT, "parameters": parameters})
        assert response.status_code == 424, parameters
        answer = response.json()
        assert answer["generated_text"] == "" and answer["details"]["finish_reason"] == "error"
        assert answer["details"]["tokens"] is None and field in answer["details"]["error_msg"]
    streamed = invoke(server, {"inputs": PROMPT, "stream": True, "parameters": {"num_beams": 2}})
    assert streamed.status_code == 424
    assert streamed.headers["content-type"] == "application/jsonlines"
    [line] = lines(streamed)
    assert line["token"]["id"] == -1 and line["details"]["finish_reason"] == "error"
    assert "$.parameters.num_beams" in line["token"]["error_msg"]
    payload = invoke(server, {"inputs": PROMPT, "parameters": {"temperature": "hot"}})
    assert payload.status_code == 424 and set(payload.json()) == {"error", "code"}


def test_a_generation_failure_gives_finish_reason_error(server: RunningServer) -> None:
    # vLLM refuses a stop token outside the vocabulary once the request reaches it.
    bad = {"inputs": PROMPT, "parameters": {"stop_token_ids": [10**9]}}
    response = invoke(server, bad)
    assert response.status_code == 424
    answer = response.json()
    assert answer["generated_text"] == "" and answer["details"]["finish_reason"] == "error"
    assert answer["details"]["tokens"] is None and "vocab" in answer["details"]["error_msg"]
    streamed = invoke(server, {**bad, "stream": True})
    assert streamed.status_code == 424  # no token was generated: the status still says so
    [line] = lines(streamed)
    assert line["token"]["id"] == -1 and line["details"]["finish_reason"] == "error"


def test_a_dynamic_batch_failing_mid_stream_ends_with_the_handler_failure_line(
    loop_thread: LoopThread, engine: VllmEngine, idle_engine: Callable[..., None]
) -> None:
    # One slot: the second prompt reaches the engine, and fails there, after the first streamed.
    settings = gateway_settings(MAX_RUNNING_REQUESTS="1")
    one_slot = start_server(loop_thread, settings, failing_loader(engine, FAULT))
    try:
        wait_ready(one_slot.http)
        body = {"inputs": [PROMPT, FAULT], "stream": True, "parameters": {"max_new_tokens": 4}}
        response = invoke(one_slot, body)
        assert response.status_code == 200
        received = lines(response)
        assert "".join(line["outputs"][0] for line in received[:-1])
        assert received[-1]["message"] == "invoke handler failure"
        assert received[-1]["code"] == 424 and "$.inputs[1]" in received[-1]["error"]
    finally:
        one_slot.stop()
    idle_engine()


def test_overload_answers_429(
    make_server: Callable[..., RunningServer], idle_engine: Callable[..., None]
) -> None:
    tight = make_server(MAX_RUNNING_REQUESTS="1", MAX_WAITING_REQUESTS="0")
    with web.stream(
        "POST",
        tight.http + "/invocations",
        json={"inputs": PROMPT, "stream": True, "parameters": LONG},
    ) as busy:
        received = busy.iter_lines()  # kept: a dropped iterator closes the connection
        next(received)
        refused = invoke(tight, {"inputs": PROMPT})
        assert refused.status_code == 429 and refused.json()["code"] == 429
    idle_engine()


def test_clients_that_leave_stop_their_generation(
    server: RunningServer,
    engine_requests: Callable[[], int],
    idle_engine: Callable[[], None],
) -> None:
    def leave_after_the_first_line(inputs: str | list[str]) -> None:
        prompts = 1 if isinstance(inputs, str) else len(inputs)
        before = settled_metrics(server.http)
        with web.stream(
            "POST",
            server.http + "/invocations",
            json={"inputs": inputs, "stream": True, "parameters": LONG},
        ) as response:
            lines = response.iter_lines()  # kept: a dropped iterator closes the connection
            next(lines)  # leaves once the first line came and every prompt runs
            wait_for(
                lambda: engine_requests() == prompts or ended_since(before, server.http, "lmi")
            )
            assert not ended_since(before, server.http, "lmi"), (
                "a generation ended before its client left"
            )
        idle_engine()
        after = settled_metrics(server.http)
        assert outcomes_since(before, after, "lmi") == {"cancelled": prompts}, inputs

    leave_after_the_first_line(PROMPT)
    leave_after_the_first_line([PROMPT, SHORT])
    before = settled_metrics(server.http)
    with leaving_client() as client:
        client.post(server.http + "/invocations", {"inputs": [PROMPT, SHORT], "parameters": LONG})
        # both run; nothing is answered until the end
        wait_for(lambda: engine_requests() == 2 or ended_since(before, server.http, "lmi"))
        assert not ended_since(before, server.http, "lmi"), (
            "a generation ended before its client left"
        )
        client.leave()
    idle_engine()
    after = settled_metrics(server.http)
    assert outcomes_since(before, after, "lmi") == {"cancelled": 2}


def test_ping_is_503_while_loading_then_answers_past_a_full_queue(
    loop_thread: LoopThread,
    engine: VllmEngine,
    make_server: Callable[..., RunningServer],
    idle_engine: Callable[[], None],
) -> None:
    with loading_server(loop_thread, engine) as (loading, finish_loading):
        assert web.get(loading.http + "/ping").status_code == 503
        finish_loading()
        wait_for(lambda: web.get(loading.http + "/ping").status_code == 200)
    busy = make_server(MAX_RUNNING_REQUESTS="2")
    admission = busy.gateway.service.admission

    def slots() -> tuple[int, int]:
        return busy.loop.call(lambda: (admission.running, admission.waiting))

    with leaving_client() as client:
        for _ in range(4):  # two generating, two queued behind them
            client.post(busy.http + "/invocations", {"inputs": PROMPT, "parameters": LONG})
        wait_for(lambda: slots() == (2, 2))
        for _ in range(5):
            # answered while every slot is taken and two requests wait: /ping takes no slot
            assert web.get(busy.http + "/ping").status_code == 200
            assert slots() == (2, 2)
        client.leave()  # which stops their generations
    idle_engine()


CHAT_BODY: dict[str, Any] = {
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "temperature": 0,
    "max_tokens": 12,
}


def test_a_body_with_messages_is_a_chat_completion(server: RunningServer) -> None:
    whole = invoke(server, CHAT_BODY)
    assert whole.status_code == 200, whole.text
    answer = whole.json()
    assert answer["object"] == "chat.completion"
    [choice] = answer["choices"]
    assert choice["message"]["role"] == "assistant" and "Paris" in choice["message"]["content"]
    assert answer["usage"]["completion_tokens"] <= 12
    by_name = web.post(server.http + "/predictions/any", json=CHAT_BODY)
    assert by_name.json()["choices"][0]["message"] == choice["message"]

    streamed = invoke(server, CHAT_BODY | {"stream": True})
    assert streamed.headers["content-type"] == "application/jsonlines"
    chunks = lines(streamed)
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == choice["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]

    as_sse = invoke(server, CHAT_BODY | {"stream": True}, headers={"Accept": "text/event-stream"})
    assert as_sse.text.endswith("data: [DONE]\n\n")
    assert events(httpx.Response(200, text=as_sse.text.removesuffix("data: [DONE]\n\n")))


def test_a_bad_chat_body_gets_openais_error(server: RunningServer) -> None:
    response = invoke(server, CHAT_BODY | {"temperature": "hot"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "temperature" and error["type"] == "invalid_request_error"
