"""WS `/ws` against the real engine, with a real websockets client."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import websockets

from clients import (
    CHAT,
    MAX_MODEL_LEN,
    UNENDING,
    connect,
    events_of,
    frames_until_done,
    greedy,
    payload,
    run_ws,
)
from protocols.generation import SamplingOptions
from serving import RunningServer

PROMPT = CHAT.format("Write a short poem about the sea.")


def test_event_order_for_one_prompt(server: RunningServer) -> None:
    config = greedy(12, ignore_eos=True)
    frames = run_ws(server.ws, payload(("p1", PROMPT), generation_config=config), {"p1"})
    types = [e["type"] for e in events_of(frames, "p1")]
    assert types[:3] == ["ACCEPTED", "STARTED", "INITIALIZED"]
    assert types[-1] == "COMPLETE"
    assert set(types[3:-1]) == {"PROGRESS"}
    progress = [e["text"] for e in events_of(frames, "p1") if e["type"] == "PROGRESS"]
    complete = events_of(frames, "p1")[-1]
    assert "".join(progress) == complete["text"]
    assert complete["new_tokens_count"] == 12
    assert complete["is_eos"] is False
    assert complete["execution_time"] > 0
    assert events_of(frames, "p1")[2]["text"] == ""


def test_only_new_tokens_false_sends_prompt_in_initialized_and_complete(
    server: RunningServer,
) -> None:
    frames = run_ws(
        server.ws,
        payload(("full", PROMPT), only_new_tokens=False, generation_config=greedy(6)),
        {"full"},
    )
    events = events_of(frames, "full")
    initialized = next(e for e in events if e["type"] == "INITIALIZED")
    assert initialized["text"] == PROMPT
    progress = "".join(e["text"] for e in events if e["type"] == "PROGRESS")
    assert events[-1]["text"] == PROMPT + progress


def test_batch_arrays_as_the_spec_draws_them(server: RunningServer) -> None:
    ids = [f"b{i}" for i in range(4)]
    refused = [("empty", ""), ("long", "word " * MAX_MODEL_LEN)]
    message = payload(
        *[(r, CHAT.format(f"Count to {i + 3}.")) for i, r in enumerate(ids)],
        *refused,
        generation_config=greedy(16, ignore_eos=True),
    )
    frames = run_ws(server.ws, message, {*ids, "empty", "long"})
    types = [frame[0]["type"] for frame in frames]
    assert all(len({e["type"] for e in frame}) == 1 for frame in frames)
    # Validation before ACCEPTED: the refused prompts get their ERROR instead.
    assert frames[0] == [{"type": "ACCEPTED", "request_id": r} for r in ids]
    assert [(e["type"], e["request_id"]) for e in frames[1]] == [("ERROR", r) for r, _ in refused]
    assert "empty" in frames[1][0]["error"] and "context" in frames[1][1]["error"]
    # STARTED, INITIALIZED and COMPLETE: one array each, covering every accepted prompt.
    assert types[2:4] == ["STARTED", "INITIALIZED"] and types[-1] == "COMPLETE"
    assert set(types[4:-1]) == {"PROGRESS"}
    for phase in (frames[2], frames[3], frames[-1]):
        assert [e["request_id"] for e in phase] == ids
    for frame in frames[4:-1]:
        assert len([e["request_id"] for e in frame]) == len({e["request_id"] for e in frame})
    # Four prompts decoding together: most engine steps advance several of them at once.
    assert sum(len(f) > 1 for f in frames[4:-1]) >= len(frames[4:-1]) // 2
    for r, complete in zip(ids, frames[-1], strict=True):
        progress = [e["text"] for e in events_of(frames[4:-1], r)]
        assert complete["new_tokens_count"] == 16 and complete["text"] == "".join(progress)


def test_a_request_id_twice_in_a_payload_refuses_the_payload_once_per_id(
    server: RunningServer,
) -> None:
    message = payload(("d1", PROMPT), ("d2", PROMPT), ("d1", PROMPT), generation_config=greedy(2))
    with connect(server.ws + "/ws") as ws:
        ws.send(message)
        refusal = json.loads(ws.recv())
        ws.send(payload(("after", PROMPT), generation_config=greedy(2)))  # the connection goes on
        after = frames_until_done(ws, {"after"})
    assert [(e["type"], e["request_id"]) for e in refusal] == [("ERROR", "d1"), ("ERROR", "d2")]
    assert all("'d1' appears more than once" in e["error"] for e in refusal)
    # Nothing of the refused payload ran: the next frames are all the other payload's.
    assert {e["request_id"] for frame in after for e in frame} == {"after"}
    assert after[0] == [{"type": "ACCEPTED", "request_id": "after"}]


def test_a_transformers_generation_config_passes_through(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    from transformers import GenerationConfig

    passed = GenerationConfig(max_new_tokens=4, do_sample=False, typical_p=0.5)  # type: ignore[no-untyped-call]
    config: dict[str, Any] = passed.to_dict()
    config["early_stopping"] = True  # honoured by beam search, harmless without it
    frames = run_ws(server.ws, payload(("hf", PROMPT), generation_config=config), {"hf"})
    complete = events_of(frames, "hf")[-1]
    assert complete["type"] == "COMPLETE" and complete["new_tokens_count"] == 4
    assert "typical_p" in caplog.text  # ignored (vLLM has no typical sampling), and logged


def test_a_request_id_in_flight_is_refused_before_acceptance(server: RunningServer) -> None:
    busy = payload(("busy", PROMPT), generation_config=greedy(UNENDING, ignore_eos=True))
    with connect(server.ws + "/ws") as first, connect(server.ws + "/ws") as second:
        first.send(busy)
        assert json.loads(first.recv()) == [{"type": "ACCEPTED", "request_id": "busy"}]
        second.send(payload(("busy", PROMPT), ("free", PROMPT), generation_config=greedy(2)))
        frames = frames_until_done(second, {"busy", "free"})
    assert frames[0] == [{"type": "ACCEPTED", "request_id": "free"}]
    [refusal] = frames[1]
    assert refusal["request_id"] == "busy" and "already generating" in refusal["error"]
    assert events_of(frames, "free")[-1]["type"] == "COMPLETE"


def test_stream_response_false_sends_no_progress(server: RunningServer) -> None:
    frames = run_ws(
        server.ws,
        payload(("quiet", PROMPT), stream_response=False, generation_config=greedy(8)),
        {"quiet"},
    )
    types = [e["type"] for e in events_of(frames, "quiet")]
    assert types == ["ACCEPTED", "STARTED", "INITIALIZED", "COMPLETE"]
    assert events_of(frames, "quiet")[-1]["text"]


def test_greedy_text_is_reproducible_and_real(server: RunningServer) -> None:
    prompt = CHAT.format("What is the capital of France?")
    first = run_ws(server.ws, payload(("g1", prompt), generation_config=greedy(12)), {"g1"})
    second = run_ws(server.ws, payload(("g2", prompt), generation_config=greedy(12)), {"g2"})
    text = events_of(first, "g1")[-1]["text"]
    assert text == events_of(second, "g2")[-1]["text"]
    assert "Paris" in text


def test_malformed_json_and_bad_fields_get_errors_and_the_connection_stays_usable(
    server: RunningServer,
) -> None:
    with connect(server.ws + "/ws") as ws:
        ws.send("{not json")
        [error] = json.loads(ws.recv())
        assert error["type"] == "ERROR" and error["request_id"] == ""  # a string, as typed
        assert "Malformed JSON" in error["error"]

        ws.send(json.dumps({"prompts": []}))
        [error] = json.loads(ws.recv())
        assert "$.prompts" in error["error"]

        ws.send(payload(("bad1", "hi"), ("bad2", "yo"), generation_config={"top_p": 7}))
        errors = json.loads(ws.recv())
        assert [e["request_id"] for e in errors] == ["bad1", "bad2"]
        assert all("$.generation_config.top_p" in e["error"] for e in errors)

        ws.send(payload(("u", "hi"), generation_config={"top_q": 1}))
        [error] = json.loads(ws.recv())
        assert error["type"] == "ERROR" and error["request_id"] == "u"
        assert "top_q" in error["error"]  # named, at the object that holds it
        assert error["error"].endswith(" - at `$.generation_config`")

        ws.send(
            json.dumps(
                {
                    "prompts": [{"request_id": "ok", "prompt": PROMPT}, {"request_id": "noprompt"}],
                    "generation_config": greedy(4),
                }
            )
        )
        frames = frames_until_done(ws, {"ok", "noprompt"})
        assert frames[0] == [{"type": "ACCEPTED", "request_id": "ok"}]
        [missing] = events_of(frames, "noprompt")
        assert missing["type"] == "ERROR" and "$.prompts[1]" in missing["error"]
        assert events_of(frames, "ok")[-1]["type"] == "COMPLETE"


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"num_beams": "two"}, "num_beams"),
        ({"min_tokens": 50, "max_new_tokens": 5}, "min_tokens"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_each_bad_field_is_named(server: RunningServer, config: dict[str, Any], field: str) -> None:
    with connect(server.ws + "/ws") as ws:
        ws.send(payload(("f", "hello"), generation_config=config))
        [error] = json.loads(ws.recv())
        assert error["type"] == "ERROR" and f"generation_config.{field}" in error["error"]


def test_beam_search_without_streaming_and_the_spec_error_when_streaming(
    server: RunningServer,
) -> None:
    beams = greedy(6, num_beams=3, length_penalty=0.5)
    frames = run_ws(
        server.ws,
        payload(("beam", PROMPT), stream_response=False, generation_config=beams),
        {"beam"},
    )
    complete = events_of(frames, "beam")[-1]
    engine = server.gateway.service.holder.engine
    assert engine is not None
    options = SamplingOptions(max_new_tokens=6, do_sample=False, num_beams=3, length_penalty=0.5)
    # The engine answers every beam, best first; /ws sends the best.
    direct, *others = server.loop.run(engine.beam_search(engine.encode(PROMPT), options))
    assert len(others) == 2
    assert complete["type"] == "COMPLETE"
    assert complete["text"] == direct.text and direct.text
    assert complete["new_tokens_count"] == len(direct.token_ids)

    frames = run_ws(server.ws, payload(("beam2", PROMPT), generation_config=beams), {"beam2"})
    [error] = events_of(frames, "beam2")
    assert error == {
        "type": "ERROR",
        "request_id": "beam2",
        "error": (
            "`streamer` cannot be used with beam search (yet!). Make sure that `num_beams` "
            "is set to 1."
        ),
    }


# `make test-all` only (issue 55: `make test`'s time on the slowest CPU).
@pytest.mark.long
def test_seed_stop_and_min_tokens_reach_the_engine(server: RunningServer) -> None:
    def complete(request_id: str, prompt: str, **config: Any) -> dict[str, Any]:
        frames = run_ws(
            server.ws, payload((request_id, prompt), generation_config=config), {request_id}
        )
        return events_of(frames, request_id)[-1]

    tokens = 12  # a dozen sampled tokens at temperature 1 tell two seeds apart
    sampled = {"do_sample": True, "temperature": 1.0, "top_k": 0, "max_new_tokens": tokens}
    first = complete("seed1", PROMPT, seed=1234, ignore_eos=True, **sampled)
    again = complete("seed2", PROMPT, seed=1234, ignore_eos=True, **sampled)
    other = complete("seed3", PROMPT, seed=99, ignore_eos=True, **sampled)
    assert first["text"] == again["text"] != other["text"]

    plain = complete("stop1", PROMPT, **greedy(tokens, ignore_eos=True))
    word = plain["text"].split()[3]
    stopped = complete("stop2", PROMPT, **greedy(tokens, ignore_eos=True), stop=[word])
    assert stopped["text"] == plain["text"][: plain["text"].index(word)]
    assert stopped["is_eos"] is False and stopped["new_tokens_count"] < tokens

    short = CHAT.format("What is 2+2?")
    natural = complete("min1", short, **greedy(200))
    assert natural["is_eos"] is True
    # Its end of sequence held off, the model writes on: a bound just past the minimum ends it
    # (200 tokens of it took most of this test's time).
    least = natural["new_tokens_count"] + 10
    longer = complete("min2", short, **greedy(least + 4), min_tokens=least)
    assert longer["new_tokens_count"] >= least


def test_payloads_on_one_connection_run_concurrently_and_never_share_an_array(
    server: RunningServer,
) -> None:
    with connect(server.ws + "/ws") as ws:
        ws.send(payload(("long", PROMPT), generation_config=greedy(40, ignore_eos=True)))
        ws.send(payload(("short", PROMPT), generation_config=greedy(4, ignore_eos=True)))
        frames = frames_until_done(ws, {"long", "short"})
    for frame in frames:
        assert len({e["request_id"] for e in frame}) == 1
    order = [e["request_id"] for f in frames for e in f if e["type"] == "COMPLETE"]
    assert order == ["short", "long"]  # the second payload did not wait for the first


def test_sixteen_concurrent_clients(server: RunningServer, idle_engine: Any) -> None:
    seen: list[str] = []  # "begun" and "ended", in the order the clients received them

    async def one(i: int) -> dict[str, Any]:
        async with websockets.connect(
            server.ws + "/ws", open_timeout=None, ping_interval=None
        ) as ws:
            await ws.send(
                payload(
                    (f"c{i}", CHAT.format(f"Say a word about {i}.")),
                    generation_config=greedy(10, ignore_eos=True),
                )
            )
            while True:
                frame = json.loads(await ws.recv())
                for event in frame:
                    if event["type"] == "INITIALIZED":
                        seen.append("begun")
                    if event["type"] in ("COMPLETE", "ERROR"):
                        seen.append("ended")
                        return dict(event)

    async def all_clients() -> list[dict[str, Any]]:
        return await asyncio.gather(*(one(i) for i in range(16)))

    results = asyncio.run(all_clients())
    assert [r["type"] for r in results] == ["COMPLETE"] * 16
    assert [r["request_id"] for r in results] == [f"c{i}" for i in range(16)]
    assert all(r["new_tokens_count"] == 10 for r in results)
    # They ran together: nearly every stream had begun before the first one finished.
    assert seen[: seen.index("ended")].count("begun") >= 12
    idle_engine()
