"""Continuation by request_id: history per key, prefix-cache reuse, order, EOS, eviction."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import httpx

from clients import CHAT, events_of, greedy, payload, run_ws
from protocols.generation import Finished, PromptItem, SamplingOptions
from serving import RunningServer


def batch(url: str, prompts: list[tuple[str, str]], **fields: object) -> list[dict[str, str]]:
    body = {"prompts": [{"request_id": r, "prompt": p} for r, p in prompts], **fields}
    response = httpx.post(url + "/api/generate-batch", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return list(response.json())


def test_a_known_request_id_continues_and_ignores_its_prompt(server: RunningServer) -> None:
    key = f"story-{uuid.uuid4()}"
    prompt = CHAT.format("Tell me a story about a lighthouse.")
    [first] = batch(server.http, [(key, prompt)], generation_config=greedy(8, ignore_eos=True))
    [second] = batch(
        server.http,
        [(key, "this prompt is ignored")],
        only_new_tokens=False,
        generation_config=greedy(8, ignore_eos=True),
    )
    assert second["prompt"] == prompt + first["response"]
    assert second["response"] and "ignored" not in second["prompt"]

    frames = run_ws(
        server.ws,
        payload(
            (key, "ignored too"),
            only_new_tokens=False,
            generation_config=greedy(4, ignore_eos=True),
        ),
        {key},
    )
    events = events_of(frames, key)
    sequence = prompt + first["response"] + second["response"]
    assert events[2] == {"type": "INITIALIZED", "request_id": key, "text": sequence}
    assert events[-1]["text"].startswith(sequence) and events[-1]["new_tokens_count"] == 4


def test_the_key_of_a_batch_is_its_ordered_request_ids(server: RunningServer) -> None:
    a, b = f"a-{uuid.uuid4()}", f"b-{uuid.uuid4()}"
    pa, pb = CHAT.format("Say hi."), CHAT.format("Say bye.")
    cfg = greedy(5, ignore_eos=True)
    first = batch(server.http, [(a, pa), (b, pb)], generation_config=cfg)
    same_order = batch(
        server.http, [(a, "x"), (b, "y")], only_new_tokens=False, generation_config=cfg
    )
    assert [r["prompt"] for r in same_order] == [
        pa + first[0]["response"],
        pb + first[1]["response"],
    ]
    other_order = batch(
        server.http, [(b, pb), (a, pa)], only_new_tokens=False, generation_config=cfg
    )
    assert [r["prompt"] for r in other_order] == [pb, pa]  # another key: a fresh start
    alone = batch(server.http, [(a, pa)], only_new_tokens=False, generation_config=cfg)
    assert alone[0]["prompt"] == pa  # a single id is another key than the pair


def test_continuing_is_served_from_the_engines_prefix_cache(server: RunningServer) -> None:
    nonce = uuid.uuid4().hex
    prompt = CHAT.format(f"{nonce} " + "Describe the ocean in great detail. " * 140)
    options = SamplingOptions(do_sample=False, max_new_tokens=8, ignore_eos=True)
    service = server.gateway.service

    async def run(request_id: str, text: str) -> Finished:
        async for step in service.run(
            [PromptItem(request_id, text)], options, stream=False, protocol="test"
        ):
            for event in step:
                if isinstance(event, Finished):
                    return event
        raise AssertionError("no Finished event")

    fresh = server.loop.run(run(nonce, prompt))
    continued = server.loop.run(run(nonce, "ignored"))
    history_tokens = len(server.gateway.holder.engine.encode(prompt)) + 8  # type: ignore[union-attr]
    assert history_tokens > 900
    assert fresh.cached_prompt_tokens < 100
    # vLLM caches whole blocks: all but the last partial block come from the cache.
    assert continued.cached_prompt_tokens >= history_tokens - 128
    assert continued.full_text == prompt + fresh.new_text + continued.new_text


def test_a_sequence_that_ended_at_eos_adds_nothing_when_continued(server: RunningServer) -> None:
    key = f"eos-{uuid.uuid4()}"
    prompt = CHAT.format("What is 2+2?")
    frames = run_ws(server.ws, payload((key, prompt), generation_config=greedy(200)), {key})
    first = events_of(frames, key)[-1]
    assert first["is_eos"] is True and 0 < first["new_tokens_count"] < 200
    frames = run_ws(
        server.ws, payload((key, "x"), only_new_tokens=False, generation_config=greedy(50)), {key}
    )
    complete = events_of(frames, key)[-1]
    assert complete == {
        "type": "COMPLETE",
        "request_id": key,
        "text": prompt + first["text"],
        "is_eos": True,
        "new_tokens_count": 0,
        "execution_time": complete["execution_time"],
    }


def test_an_evicted_key_starts_afresh(make_server: Callable[..., RunningServer]) -> None:
    small = make_server(CONTINUATION_MAX_ENTRIES="1", CONTINUATION_IDLE_SECONDS="1")
    cfg = greedy(3, ignore_eos=True)
    p1, p2 = CHAT.format("One."), CHAT.format("Two.")
    batch(small.http, [("k1", p1)], generation_config=cfg)
    batch(small.http, [("k2", p2)], generation_config=cfg)  # evicts k1 (one entry at most)
    [again] = batch(small.http, [("k1", p1)], only_new_tokens=False, generation_config=cfg)
    assert again["prompt"] == p1
    [kept] = batch(small.http, [("k1", "z")], only_new_tokens=False, generation_config=cfg)
    assert kept["prompt"].startswith(p1) and len(kept["prompt"]) > len(p1)
    time.sleep(1.2)  # idle longer than CONTINUATION_IDLE_SECONDS
    [idle] = batch(small.http, [("k1", p1)], only_new_tokens=False, generation_config=cfg)
    assert idle["prompt"] == p1
