"""Per-key limits (docs/SECURITY.md): concurrency, prompts and tokens a minute, each refused
with 429 and Retry-After (or the protocol's in-band error), never touching another key. Every
engine sequence counts: a request's `n`, `best_of` or `num_beams` sequences each hold one of
its key's concurrent slots, and each one's tokens count toward its minute (issue 31)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import ValidationError

from clients import CHAT, UNENDING, connect, greedy, leaving_client, payload, wait_for, web
from gateway.config.settings import ConfigError
from gateway.edge.api_keys import parse_keys
from gateway.edge.limits import Limiter, Limits, RateLimited
from gateway.engine_path.sequences import SequenceBounds, checked_sequences
from protocols.errors import GenerationError
from protocols.generation import GenerationRequest, SamplingOptions, sequences_asked
from serving import RunningServer

ONE_AT_A_TIME, TWO_A_MINUTE, FEW_TOKENS, FREE, TWO_AT_ONCE = (
    "sk-one-at-a-time-000",
    "sk-two-a-minute-0000",
    "sk-few-tokens-000000",
    "sk-free-000000000000",
    "sk-two-at-once-00000",
)
FOREVER = {"max_new_tokens": UNENDING, "ignore_eos_token": True}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_limiter_counts_each_caller_in_a_sliding_minute() -> None:
    clock = Clock()
    limiter = Limiter(clock)

    def run(caller: str, limits: Limits, tokens: int = 0) -> None:
        limiter.acquire(caller, limits)
        limiter.release(caller, limits, tokens)

    per_minute = Limits(per_minute=2)
    run("a", per_minute)
    clock.now += 30
    run("a", per_minute)
    with pytest.raises(RateLimited) as refused:
        limiter.acquire("a", per_minute)
    assert refused.value.retry_after == pytest.approx(30.0)
    run("b", per_minute)  # another caller is not touched
    clock.now += 30.5
    run("a", per_minute)  # the first has left the window

    tokens = Limits(tokens_per_minute=10)
    run("t", tokens, 6)
    clock.now += 10
    run("t", tokens, 6)
    with pytest.raises(RateLimited) as refused:
        limiter.acquire("t", tokens)
    assert refused.value.retry_after == pytest.approx(50.0)  # then 6 of 12 have aged out
    clock.now += 61
    assert len(limiter) == 0  # idle callers are forgotten: connections come and go


def test_the_keys_file_overrides_limits_and_refuses_a_typo() -> None:
    defaults = Limits(concurrent=8)
    keys = parse_keys("", "k1:batch concurrent=2 rpm=30 tpm=5000\nk2:ui\n", defaults)
    assert keys["k1"].limits == Limits(2, 30, 5000)
    assert keys["k2"].limits == defaults
    with pytest.raises(ConfigError, match="batch") as refused:
        parse_keys("", "k1:batch rpn=3\n", defaults)
    assert "k1" not in str(refused.value).replace("batch", "")


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("limits") / "keys.txt"
    path.write_text(
        f"{ONE_AT_A_TIME}:one concurrent=1\n{TWO_A_MINUTE}:two rpm=2\n"
        f"{FEW_TOKENS}:few tpm=5\n{FREE}:free\n{TWO_AT_ONCE}:pair concurrent=2\n"
    )
    return path


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@contextmanager
def generating(server: RunningServer, key: str) -> Iterator[None]:
    """A TGI stream of `key` that runs until the block ends (its first token has come)."""
    body = {"inputs": CHAT.format("Count to a million."), "parameters": FOREVER, "stream": True}
    headers = bearer(key)
    with (
        web.client() as http,
        http.stream("POST", server.http + "/", json=body, headers=headers) as stream,
    ):
        assert stream.status_code == 200
        lines = stream.iter_lines()  # kept: closing it would close the stream
        while not next(lines).startswith("data:"):
            pass
        yield


def test_concurrency_over_the_limit_is_429_with_retry_after_and_spares_other_keys(
    make_server: Any, limited: Path
) -> None:
    server = make_server(API_KEYS_FILE=str(limited))
    question: list[Any] = [{"role": "user", "content": "Hi"}]
    chat = {"messages": question, "max_tokens": 2}
    with generating(server, ONE_AT_A_TIME):
        second = web.post(
            server.http + "/v1/chat/completions", json=chat, headers=bearer(ONE_AT_A_TIME)
        )
        assert second.status_code == 429, second.text
        assert second.json()["error"]["type"] == "rate_limit_error"
        assert "limit is 1" in second.json()["error"]["message"]
        assert int(second.headers["retry-after"]) >= 1
        tgi = web.post(
            server.http + "/generate", json={"inputs": "Hi"}, headers=bearer(ONE_AT_A_TIME)
        )
        assert tgi.status_code == 429 and "retry-after" in tgi.headers
        assert tgi.json()["error_type"] == "overloaded"
        api = openai.OpenAI(base_url=server.http + "/v1", api_key=FREE, max_retries=0)
        model = api.models.list().data[0].id
        answer = api.chat.completions.create(model=model, messages=question, max_tokens=2)
        assert answer.choices[0].message.content
    # The stream has ended: the key may generate again.
    again = web.post(server.http + "/v1/chat/completions", json=chat, headers=bearer(ONE_AT_A_TIME))
    assert again.status_code == 200, again.text


def test_prompts_a_minute_then_429_in_each_shape_and_in_band_on_websockets(
    make_server: Any, limited: Path
) -> None:
    server = make_server(API_KEYS_FILE=str(limited))
    body = {"inputs": "Hi", "parameters": {"max_new_tokens": 1}}
    for _ in range(2):
        ok = web.post(server.http + "/invocations", json=body, headers=bearer(TWO_A_MINUTE))
        assert ok.status_code == 200, ok.text
    over = web.post(server.http + "/invocations", json=body, headers=bearer(TWO_A_MINUTE))
    assert over.status_code == 429, over.text
    assert 1 <= int(over.headers["retry-after"]) <= 60
    assert "2 prompts a minute" in over.text
    api = openai.OpenAI(base_url=server.http + "/v1", api_key=TWO_A_MINUTE, max_retries=0)
    with pytest.raises(openai.RateLimitError) as refused:
        api.completions.create(model=api.models.list().data[0].id, prompt="Hi", max_tokens=1)
    assert refused.value.response.headers["retry-after"]
    with connect(server.ws + "/ws", [f"bearer.{TWO_A_MINUTE}"]) as ws:
        ws.send(payload(("r1", "Hi"), generation_config=greedy(1)))
        events = json.loads(ws.recv())
        assert [e["type"] for e in events] == ["ERROR"]
        assert "a minute" in events[0]["error"]
    free = web.post(server.http + "/invocations", json=body, headers=bearer(FREE))
    assert free.status_code == 200


def test_tokens_a_minute_count_what_was_generated(make_server: Any, limited: Path) -> None:
    server = make_server(API_KEYS_FILE=str(limited))
    body = {"inputs": "Hi", "parameters": {"max_new_tokens": 8, "ignore_eos_token": True}}
    first = web.post(server.http + "/generate", json=body, headers=bearer(FEW_TOKENS))
    assert first.status_code == 200, first.text
    over = web.post(server.http + "/generate", json=body, headers=bearer(FEW_TOKENS))
    assert over.status_code == 429 and "5 tokens a minute" in over.json()["error"]


def test_without_keys_each_connection_has_the_default_limits(make_server: Any) -> None:
    server = make_server(LIMIT_CONCURRENT_REQUESTS="1")
    forever = {"do_sample": False, "max_new_tokens": UNENDING, "ignore_eos": True}
    with connect(server.ws + "/ws") as busy, connect(server.ws + "/ws") as other:
        busy.send(payload(("b1", "Count."), ("b2", "Count."), generation_config=forever))
        refused = None
        while refused is None:  # b2 is refused in-band while b1 runs
            frame = json.loads(busy.recv())
            refused = next((e for e in frame if e["type"] == "ERROR"), None)
        assert refused["request_id"] in {"b1", "b2"} and "at once" in refused["error"]
        other.send(payload(("o1", "Hi"), generation_config=greedy(2)))
        while not any(e["type"] == "COMPLETE" for e in json.loads(other.recv())):
            pass


# --- Every engine sequence counts (issue 31) ---------------------------------------------------

BOUNDS = SequenceBounds(n=16, best_of=2, num_beams=10)


def test_the_limiter_counts_a_prompts_sequences() -> None:
    limiter, pair = Limiter(Clock()), Limits(concurrent=2)
    limiter.acquire("k", pair, 2)
    with pytest.raises(RateLimited, match="limit is 2"):
        limiter.acquire("k", pair, 1)
    limiter.release("k", pair, 0, 2)
    limiter.acquire("k", pair, 1)
    with pytest.raises(RateLimited):
        limiter.acquire("k", pair, 2)  # one running, two asked for: three
    limiter.acquire("k", pair, 1)


def _request(n: int = 1, num_beams: int = 1) -> GenerationRequest:
    return GenerationRequest(
        options=SamplingOptions(n=n, num_beams=num_beams),
        asked=sequences_asked("$.parameters", n=n, num_beams=num_beams),
    )


def test_a_requests_sequences_are_its_engine_sequences_bounded_by_field() -> None:
    assert checked_sequences(_request(), BOUNDS, 0) == 1
    assert checked_sequences(_request(n=4), BOUNDS, 0) == 4
    assert checked_sequences(_request(num_beams=3, n=3), BOUNDS, 0) == 3  # the beams
    with pytest.raises(GenerationError) as refused:
        checked_sequences(_request(num_beams=11), BOUNDS, 0)
    assert refused.value.field == "$.parameters.num_beams"
    assert "MAX_NUM_BEAMS" in refused.value.message
    with pytest.raises(GenerationError) as refused:
        checked_sequences(_request(n=4), BOUNDS, 2)  # more than the key may ever run at once
    assert refused.value.field == "$.parameters.n" and "limit of 2" in refused.value.message
    # OpenAI streams each of `n` choices as a request of its own: `n` still names them all.
    choice = GenerationRequest(options=SamplingOptions(), asked=sequences_asked("$", n=4))
    assert checked_sequences(choice, BOUNDS, 4) == 1
    with pytest.raises(GenerationError) as refused:
        checked_sequences(choice, BOUNDS, 2)
    assert refused.value.field == "$.n"
    # A request that names none (a default of the server's) is named by its options' fields.
    beams = GenerationRequest(options=SamplingOptions(num_beams=3))
    with pytest.raises(GenerationError) as refused:
        checked_sequences(beams, BOUNDS, 2)
    assert refused.value.field == "$.num_beams"


def test_a_request_asking_more_sequences_than_its_key_may_run_is_refused_naming_the_field(
    make_server: Any, limited: Path
) -> None:
    server = make_server(API_KEYS_FILE=str(limited), MAX_BEST_OF="4")
    api = openai.OpenAI(base_url=server.http + "/v1", api_key=TWO_AT_ONCE, max_retries=0)
    model = api.models.list().data[0].id
    for stream in (False, True):  # streamed, each choice is an engine request of its own
        with pytest.raises(openai.BadRequestError) as refused:
            api.completions.create(model=model, prompt="Hi", max_tokens=1, n=3, stream=stream)
        assert refused.value.param == "n" and "limit of 2" in refused.value.message
    tgi = InferenceClient(base_url=server.http, token=TWO_AT_ONCE)
    with pytest.raises(ValidationError, match=r"best_of.*limit of 2"):
        tgi.text_generation(CHAT.format("Hi"), max_new_tokens=1, best_of=3, do_sample=True)
    for parameters, field in (
        ({"num_beams": 3}, "$.parameters.num_beams"),
        ({"n": 2, "best_of": 3, "do_sample": True}, "$.parameters.best_of"),
    ):
        lmi = {"inputs": "Hi", "parameters": {"max_new_tokens": 1, **parameters}}
        answer = web.post(server.http + "/invocations", json=lmi, headers=bearer(TWO_AT_ONCE))
        assert answer.status_code == 424 and field in answer.text, answer.text
    one = {
        "request_id": "beams",
        "prompt": CHAT.format("Hi"),
        "stream_response": False,
        "generation_config": greedy(1, num_beams=3),
    }
    answer = web.post(server.http + "/api/generate-one", json=one, headers=bearer(TWO_AT_ONCE))
    assert answer.status_code == 422 and answer.json()["field"] == "$.generation_config.num_beams"
    # As many as the key may run are served.
    pair = api.completions.create(model=model, prompt="Hi", max_tokens=1, n=2)
    assert len(pair.choices) == 2


def test_a_keys_running_sequences_never_exceed_its_limit(
    make_server: Any,
    limited: Path,
    engine_requests: Callable[[], int],
    idle_engine: Callable[[], None],
) -> None:
    server = make_server(API_KEYS_FILE=str(limited))
    idle_engine()
    two = {"prompt": "Count.", "max_tokens": UNENDING, "ignore_eos": True, "n": 2}
    with leaving_client() as client:
        client.post(server.http + "/v1/completions", two, bearer(TWO_AT_ONCE))
        wait_for(lambda: engine_requests() == 2)  # the engine runs n = 2 as two requests
        third = web.post(
            server.http + "/generate",
            json={"inputs": "Hi", "parameters": {"max_new_tokens": 1}},
            headers=bearer(TWO_AT_ONCE),
        )
        assert third.status_code == 429 and "limit is 2" in third.json()["error"], third.text
        assert engine_requests() == 2 and client.unanswered() == 1
        free = web.post(
            server.http + "/generate",
            json={"inputs": "Hi", "parameters": {"max_new_tokens": 1}},
            headers=bearer(FREE),
        )
        assert free.status_code == 200, free.text  # another key's limits are its own
        client.leave()
    idle_engine()
    again = web.post(
        server.http + "/generate",
        json={"inputs": "Hi", "parameters": {"max_new_tokens": 1}},
        headers=bearer(TWO_AT_ONCE),
    )
    assert again.status_code == 200, again.text  # the sequences that left gave their slots back


def test_tokens_a_minute_count_every_beam(make_server: Any, limited: Path) -> None:
    server = make_server(API_KEYS_FILE=str(limited))
    one = {
        "request_id": "beams",
        "prompt": CHAT.format("Hi"),
        "stream_response": False,
        # Three beams of two tokens: six tokens, past the key's five, though one is answered.
        "generation_config": greedy(2, num_beams=3, ignore_eos=True),
    }
    first = web.post(server.http + "/api/generate-one", json=one, headers=bearer(FEW_TOKENS))
    assert first.status_code == 200, first.text
    over = web.post(server.http + "/api/generate-one", json=one, headers=bearer(FEW_TOKENS))
    assert over.status_code == 429 and "5 tokens a minute" in over.text, over.text
