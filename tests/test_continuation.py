"""Continuation by request_id: history per key, prefix-cache reuse, order, EOS, eviction."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from clients import CHAT, events_of, greedy, payload, run_ws, settled_metrics, value, web
from serving import RunningServer

PROTOCOL = "api_generate_batch"  # the metrics' name for POST /api/generate-batch


def batch(url: str, prompts: list[tuple[str, str]], **fields: object) -> list[dict[str, str]]:
    body = {"prompts": [{"request_id": r, "prompt": p} for r, p in prompts], **fields}
    response = web.post(url + "/api/generate-batch", json=body)
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
    cfg = greedy(8, ignore_eos=True)

    def run(text: str) -> tuple[dict[str, str], float, float]:
        """Sends `text` under the key: the answer, its prompt tokens and how many were cached."""
        before = settled_metrics(server.http)
        [answer] = batch(server.http, [(nonce, text)], only_new_tokens=False, generation_config=cfg)
        after = settled_metrics(server.http)

        def grew(name: str) -> float:
            return value(after, name, protocol=PROTOCOL) - value(before, name, protocol=PROTOCOL)

        return (
            answer,
            grew("gateway_prompt_tokens_total"),
            grew("gateway_prompt_tokens_cached_total"),
        )

    fresh, prompt_tokens, fresh_cached = run(prompt)
    continued, history_tokens, continued_cached = run("ignored")
    assert history_tokens == prompt_tokens + 8  # the whole history is the continued prompt
    assert history_tokens > 900
    assert fresh_cached < 100
    # vLLM caches whole blocks: all but the last partial block come from the cache.
    assert continued_cached >= history_tokens - 128
    assert fresh["prompt"] == prompt and continued["prompt"] == prompt + fresh["response"]
    assert fresh["response"] and continued["response"]


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
    # Expiry after CONTINUATION_IDLE_SECONDS is the store's own, tested with a fake clock in
    # test_admission_and_store.py; here a key is dropped by the bound on entries.
    small = make_server(CONTINUATION_MAX_ENTRIES="1")
    cfg = greedy(3, ignore_eos=True)
    p1, p2 = CHAT.format("One."), CHAT.format("Two.")
    batch(small.http, [("k1", p1)], generation_config=cfg)
    batch(small.http, [("k2", p2)], generation_config=cfg)  # evicts k1 (one entry at most)
    [again] = batch(small.http, [("k1", p1)], only_new_tokens=False, generation_config=cfg)
    assert again["prompt"] == p1
    [kept] = batch(small.http, [("k1", "z")], only_new_tokens=False, generation_config=cfg)
    assert kept["prompt"].startswith(p1) and len(kept["prompt"]) > len(p1)
    batch(small.http, [("k2", p2)], generation_config=cfg)  # k2 afresh, which drops k1 again
    [dropped] = batch(small.http, [("k1", p1)], only_new_tokens=False, generation_config=cfg)
    assert dropped["prompt"] == p1


def test_a_continuation_after_a_stop_string_continues_the_text_the_client_holds(
    server: RunningServer,
) -> None:
    prompt = CHAT.format("Write a short story about a robot learning to paint.")
    whole = one(server.http, f"plain-{uuid.uuid4()}", prompt, greedy(30))
    # A stop string that begins inside a word token: the client holds that word's space.
    words = whole.split(" ")
    cut = len(words[0]) + len(words[1]) + len(words[2]) + 3  # after the third space
    stop = whole[cut : cut + len(words[3]) + 3]
    key = f"stopped-{uuid.uuid4()}"
    first = one(server.http, key, prompt, greedy(60, stop=[stop]))
    assert first == whole[:cut], (stop, first)
    continued = one(server.http, key, "", greedy(8, ignore_eos=True), only_new_tokens=False)
    assert continued.startswith(prompt + first)
    fresh = one(server.http, f"fresh-{uuid.uuid4()}", prompt + first, greedy(8, ignore_eos=True))
    assert continued == prompt + first + fresh, (stop, first)


def one(url: str, request_id: str, prompt: str, config: dict[str, object], **fields: object) -> str:
    body = {"request_id": request_id, "prompt": prompt, "generation_config": config, **fields}
    response = web.post(url + "/api/generate-one", json=body)
    assert response.status_code == 200, response.text
    return response.text
