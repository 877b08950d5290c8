"""Background responses (`background: true`) with the official `openai` client: they run with no
client attached, any number of readers of their key stream their events from any point, each
once and in order, `cancel` stops them in the engine, a drain ends them `incomplete`, and with
REDIS_URL a reader on another gateway gets the same events."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest
from openai.types.responses import ResponseIncompleteEvent
from redis_server import RedisServer, running_redis

from clients import scrape, value, wait_for
from serving import RunningServer

MODEL = "SmolLM2-135M-Instruct"
KEY, OTHER = "sk-background-one", "sk-background-two"
ENDED = ("response.completed", "response.incomplete")  # by itself: EOS, or max_output_tokens
STORY = "Write a long, detailed story about a dragon who learns to bake bread in a village."


def client(server: RunningServer, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.http + "/v1", api_key=key, max_retries=0)


def text_of(events: list[Any]) -> str:
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


def read_all(api: openai.OpenAI, response_id: str, after: int | None = None) -> list[Any]:
    """Every event after `after` (all without it) to the terminal one."""
    if after is None:
        stream = api.responses.retrieve(response_id, stream=True)
    else:
        stream = api.responses.retrieve(response_id, stream=True, starting_after=after)
    with stream:
        return list(stream)


def running(server: RunningServer) -> float:
    """Requests holding an engine slot, as /metrics says."""
    return value(scrape(server.http), "gateway_running_requests")


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with running_redis() as server:
        yield server


def test_a_dropped_stream_reattaches_after_its_last_event_and_gets_the_rest(
    server: RunningServer,
) -> None:
    api = client(server)
    stream = api.responses.create(
        model=MODEL,
        input=STORY,
        max_output_tokens=48,
        temperature=0,
        background=True,
        stream=True,
    )
    before: list[Any] = []
    for event in stream:
        before.append(event)
        if sum(e.type == "response.output_text.delta" for e in before) == 3:
            break
    stream.close()  # the connection drops; the generation goes on
    kinds = [e.type for e in before]
    assert kinds[:3] == ["response.created", "response.queued", "response.in_progress"]
    assert before[0].response.status == "queued" and before[0].response.background is True
    response_id = before[0].response.id
    last = before[-1].sequence_number

    after = read_all(api, response_id, after=last)
    numbers = [e.sequence_number for e in before + after]
    assert numbers == list(range(len(numbers)))  # every event once, in order
    final = after[-1]
    assert final.type in ENDED
    assert text_of(before) + text_of(after) == final.response.output_text != ""
    stored = api.responses.retrieve(response_id)
    assert stored.status == final.response.status
    assert stored.output_text == final.response.output_text
    again = read_all(api, response_id)  # it ended: every kept event, from the first
    assert [e.sequence_number for e in again] == numbers


def test_a_background_response_answers_at_once_and_two_readers_get_it_whole(
    server: RunningServer,
) -> None:
    api = client(server)
    made = api.responses.create(
        model=MODEL, input=STORY, max_output_tokens=40, temperature=0, background=True
    )
    assert made.status in ("queued", "in_progress") and made.background is True
    with ThreadPoolExecutor(2) as pool:
        readers = [pool.submit(read_all, api, made.id) for _ in range(2)]
        first, second = (reader.result() for reader in readers)
    assert [e.sequence_number for e in first] == list(range(len(first)))
    assert [(e.type, e.sequence_number) for e in first] == [
        (e.type, e.sequence_number) for e in second
    ]
    assert first[-1].type in ENDED
    assert text_of(first) == text_of(second) == first[-1].response.output_text
    assert api.responses.retrieve(made.id).output_text == first[-1].response.output_text


def test_cancel_stops_it_in_the_engine(make_server: Callable[..., RunningServer]) -> None:
    guarded = make_server(API_KEYS=f"{KEY},{OTHER}", METRICS_PUBLIC="true")
    api = client(guarded, KEY)
    made = api.responses.create(
        model=MODEL, input=STORY, max_output_tokens=1500, temperature=0, background=True
    )
    with pytest.raises(openai.NotFoundError):
        read_all(client(guarded, OTHER), made.id)
    with pytest.raises(openai.NotFoundError):
        client(guarded, OTHER).responses.cancel(made.id)
    with api.responses.retrieve(made.id, stream=True) as stream:
        seen = []
        for event in stream:
            seen.append(event)
            if event.type == "response.output_text.delta":
                break
        assert running(guarded) == 1  # it holds its slot
        cancelled = api.responses.cancel(made.id)
        assert cancelled.status == "cancelled"
        rest = list(stream)
    # The SDK's stream types have no event of its own for it: its incomplete event, typed.
    last = rest[-1]
    assert isinstance(last, ResponseIncompleteEvent)
    assert last.response.status == "cancelled"
    numbers = [e.sequence_number for e in seen + rest]
    assert numbers == list(range(len(numbers)))
    wait_for(lambda: running(guarded) == 0)
    assert api.responses.retrieve(made.id).status == "cancelled"
    assert api.responses.cancel(made.id).status == "cancelled"  # twice: as it is

    plain = api.responses.create(model=MODEL, input="Hi", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError) as refused:
        api.responses.cancel(plain.id)
    assert refused.value.body["param"] == "response_id"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as not_kept:
        read_all(api, plain.id)
    assert not_kept.value.body["param"] == "stream"  # type: ignore[index]


def test_background_needs_store(server: RunningServer) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client(server).responses.create(
            model=MODEL, input="Hi", background=True, store=False, max_output_tokens=2
        )
    assert refused.value.body["param"] == "background"  # type: ignore[index]


def test_with_redis_a_reader_on_another_gateway_gets_the_same_events(
    make_server: Callable[..., RunningServer], redis_server: RedisServer
) -> None:
    first = make_server(REDIS_URL=redis_server.url, API_KEYS=KEY)
    second = make_server(REDIS_URL=redis_server.url, API_KEYS=KEY)
    made = client(first, KEY).responses.create(
        model=MODEL, input=STORY, max_output_tokens=40, temperature=0, background=True
    )
    with ThreadPoolExecutor(2) as pool:
        here = pool.submit(read_all, client(first, KEY), made.id)
        there = pool.submit(read_all, client(second, KEY), made.id)
        mine, theirs = here.result(), there.result()
    assert [e.model_dump() for e in theirs] == [e.model_dump() for e in mine]
    assert theirs[-1].type in ENDED
    assert text_of(theirs) == client(second, KEY).responses.retrieve(made.id).output_text


def test_with_redis_cancel_on_another_gateway_stops_it_where_it_runs(
    make_server: Callable[..., RunningServer], redis_server: RedisServer
) -> None:
    first = make_server(REDIS_URL=redis_server.url)
    second = make_server(REDIS_URL=redis_server.url)
    made = client(first).responses.create(
        model=MODEL, input=STORY, max_output_tokens=1500, temperature=0, background=True
    )
    with client(second).responses.retrieve(made.id, stream=True) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                break
        assert client(second).responses.cancel(made.id).status == "cancelled"
        last = list(stream)[-1]
    assert isinstance(last, ResponseIncompleteEvent) and last.response.status == "cancelled"
    wait_for(lambda: running(first) == 0)
    assert client(first).responses.retrieve(made.id).status == "cancelled"


def test_a_drain_ends_a_background_response_incomplete_saying_so(
    make_server: Callable[..., RunningServer], redis_server: RedisServer
) -> None:
    """The drained gateway's response, read on another gateway sharing its Redis."""
    draining = make_server(REDIS_URL=redis_server.url, DRAIN_SECONDS="0")
    other = make_server(REDIS_URL=redis_server.url)
    made = client(draining).responses.create(
        model=MODEL, input=STORY, max_output_tokens=1500, temperature=0, background=True
    )
    with client(other).responses.retrieve(made.id, stream=True) as stream:
        seen = []
        for event in stream:
            seen.append(event)
            if event.type == "response.output_text.delta":
                break
        draining.drain()
        rest = list(stream)
    wait_for(draining.stopped)
    final: Any = rest[-1]  # its reason is the gateway's own: the SDK's types do not list it
    assert final.type == "response.incomplete"
    assert final.response.incomplete_details.reason == "server_shutdown"
    numbers = [e.sequence_number for e in seen + rest]
    assert numbers == list(range(len(numbers)))
    stored = client(other).responses.retrieve(made.id)
    assert stored.status == "incomplete" and stored.incomplete_details is not None
    assert str(stored.incomplete_details.reason) == "server_shutdown"
