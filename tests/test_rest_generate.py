"""POST `/api/generate-one` and `/api/generate-batch` with a real httpx client."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from clients import (
    CHAT,
    UNENDING,
    ended_since,
    greedy,
    leaving_client,
    outcomes_since,
    settled_metrics,
    wait_for,
    web,
)
from serving import RunningServer

PROMPT = CHAT.format("Name three colours.")
PROTOCOL = "api_generate_one"  # the metrics' name for POST /api/generate-one


def one(request_id: str, **fields: object) -> dict[str, object]:
    # The session's server is shared: an id another test file used would continue its history.
    return {"request_id": f"generate-one-{request_id}", "prompt": PROMPT, **fields}


def test_generate_one_streams_text_per_token(server: RunningServer) -> None:
    chunks: list[str] = []
    with web.stream(
        "POST",
        server.http + "/api/generate-one",
        json=one("s1", generation_config=greedy(12, ignore_eos=True)),
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        chunks = list(response.iter_text())
    assert len(chunks) >= 6  # flushed as it is generated, not in one piece
    whole = web.post(
        server.http + "/api/generate-one",
        json=one("s2", stream_response=False, generation_config=greedy(12, ignore_eos=True)),
    )
    assert whole.status_code == 200 and whole.text == "".join(chunks)


def test_generate_one_sends_the_prompt_first_when_only_new_tokens_is_false(
    server: RunningServer,
) -> None:
    with web.stream(
        "POST",
        server.http + "/api/generate-one",
        json=one("p1", only_new_tokens=False, generation_config=greedy(5)),
    ) as r:
        chunks = list(r.iter_text())
    assert "".join(chunks).startswith(PROMPT)
    assert len("".join(chunks)) > len(PROMPT)
    whole = web.post(
        server.http + "/api/generate-one",
        json=one("p2", only_new_tokens=False, stream_response=False, generation_config=greedy(5)),
    )
    assert whole.text == "".join(chunks)


def test_generate_batch_answers_in_order_with_prompt_only_when_asked(
    server: RunningServer,
) -> None:
    prompts = [
        {"request_id": "ba", "prompt": CHAT.format("Hi")},
        {"request_id": "bb", "prompt": CHAT.format("Bye")},
    ]
    new_only = web.post(
        server.http + "/api/generate-batch",
        json={"prompts": prompts, "generation_config": greedy(6)},
    ).json()
    assert [a["request_id"] for a in new_only] == ["ba", "bb"]
    assert all(set(a) == {"request_id", "response"} and a["response"] for a in new_only)

    prompts = [
        {"request_id": "bc", "prompt": CHAT.format("Hi")},
        {"request_id": "bd", "prompt": CHAT.format("Bye")},
    ]
    full = web.post(
        server.http + "/api/generate-batch",
        json={"prompts": prompts, "only_new_tokens": False, "generation_config": greedy(6)},
    ).json()
    assert [a["prompt"] for a in full] == [p["prompt"] for p in prompts]
    assert [a["response"] for a in full] == [a["response"] for a in new_only]


def test_one_bad_prompt_fails_alone_in_a_batch(server: RunningServer) -> None:
    answers = web.post(
        server.http + "/api/generate-batch",
        json={
            "prompts": [
                {"request_id": "good", "prompt": PROMPT},
                {"request_id": "bad", "prompt": 5},
            ],
            "generation_config": greedy(4),
        },
    ).json()
    assert answers[0]["request_id"] == "good" and answers[0]["response"]
    assert answers[1]["request_id"] == "bad" and answers[1]["response"] == ""
    assert answers[1]["field"] == "$.prompts[1].prompt"


def test_generation_config_fields_vllm_lacks_are_accepted_and_logged(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    config = greedy(4, epsilon_cutoff=0.01, no_repeat_ngram_size=None, early_stopping=False)
    answer = web.post(
        server.http + "/api/generate-one",
        json=one("hf", stream_response=False, generation_config=config),
    )
    assert answer.status_code == 200 and answer.text
    assert "epsilon_cutoff" in caplog.text and "no_repeat_ngram_size" not in caplog.text  # null
    typo = one("typo", generation_config=greedy(4, typical_q=0.5))
    refused = web.post(server.http + "/api/generate-one", json=typo)
    assert refused.status_code == 422
    assert refused.json()["field"] == "$.generation_config.typical_q"


def test_a_batch_whose_every_prompt_is_invalid_answers_422(server: RunningServer) -> None:
    prompts = [
        {"request_id": "empty", "prompt": ""},
        {"request_id": "long", "prompt": "word " * 3000},
        {"request_id": "empty", "prompt": PROMPT},  # a request_id twice
    ]
    answer = web.post(
        server.http + "/api/generate-batch",
        json={"prompts": prompts, "generation_config": greedy(4)},
    )
    assert answer.status_code == 422, answer.text
    assert answer.json()["type"] == "invalid_request"
    assert answer.json()["field"] == "$.prompts[0].prompt"


def test_bad_input_gets_4xx_json_naming_the_field(server: RunningServer) -> None:
    cases = [
        (b"{oops", "$"),
        (b'{"prompt": "x"}', "$.request_id"),
        (
            b'{"request_id": "x", "prompt": "y", "generation_config": {"top_k": "z"}}',
            "$.generation_config.top_k",
        ),
        (
            b'{"request_id": "x", "prompt": "y", "generation_config": {"num_beams": 2}}',
            "$.generation_config.num_beams",
        ),
        (b'{"request_id": "x", "prompt": "y", "extra": 1}', "$.extra"),
    ]
    for body, field in cases:
        response = web.post(server.http + "/api/generate-one", content=body)
        assert response.status_code == 422, body
        assert response.json()["field"] == field
        assert response.json()["type"] == "invalid_request"
    batch = web.post(
        server.http + "/api/generate-batch",
        json={
            "prompts": [{"request_id": "x", "prompt": "y"}],
            "generation_config": {"max_new_tokens": -1},
        },
    )
    assert batch.status_code == 422
    assert batch.json()["field"] == "$.generation_config.max_new_tokens"


def test_a_prompt_longer_than_the_context_is_refused(server: RunningServer) -> None:
    response = web.post(
        server.http + "/api/generate-one",
        json={"request_id": "huge", "prompt": "word " * 3000},
    )
    assert response.status_code == 422
    assert response.json()["type"] == "context_length_exceeded"


def test_streaming_client_that_leaves_stops_its_generation(
    server: RunningServer,
    engine_requests: Callable[[], int],
    idle_engine: Callable[[], None],
) -> None:
    before = settled_metrics(server.http)
    with web.stream(
        "POST",
        server.http + "/api/generate-one",
        json=one("gone", generation_config=greedy(UNENDING, ignore_eos=True)),
    ) as r:
        assert r.status_code == 200, r.read()
        chunks = r.iter_text()
        assert next(chunks)  # the client leaves once the first chunk came
        running = engine_requests()
        if running != 1:  # say how the stream went on, to tell a cut stream from a slow count
            rest = list(chunks)
            raise AssertionError(f"{running} engine requests; then {len(rest)} more chunks")
    idle_engine()
    after = settled_metrics(server.http)
    assert outcomes_since(before, after, PROTOCOL) == {"cancelled": 1}


def test_non_streaming_client_that_leaves_stops_its_generation(
    server: RunningServer,
    engine_requests: Callable[[], int],
    idle_engine: Callable[[], None],
) -> None:
    before = settled_metrics(server.http)
    body = one("gone2", stream_response=False, generation_config=greedy(UNENDING, ignore_eos=True))
    with leaving_client() as client:
        client.post(server.http + "/api/generate-one", body)
        # generating: nothing is answered until the end
        wait_for(lambda: engine_requests() > 0 or ended_since(before, server.http, PROTOCOL))
        assert not ended_since(before, server.http, PROTOCOL), "ended before its client left"
        client.leave()
    idle_engine()
    after = settled_metrics(server.http)
    assert outcomes_since(before, after, PROTOCOL) == {"cancelled": 1}
