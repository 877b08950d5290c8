"""Pure codec tests for `protocols/`: no server, no engine."""

from __future__ import annotations

import json

import msgspec
import pytest

from protocols.batch_events import PayloadFrames, decode_frame, encode_frame
from protocols.batch_payload import Rejected, decode_batch, refuse_repeated_ids
from protocols.errors import ErrorKind, GenerationError, invalid
from protocols.events import (
    Delta,
    Event,
    Failed,
    Finished,
    GeneratedSequence,
    History,
    Initialized,
    Queued,
    Started,
    token_array,
)
from protocols.generation import PromptItem, SamplingOptions
from protocols.generation_config import STREAMING_BEAM_SEARCH_ERROR
from protocols.rest_generate import (
    answer_of,
    batch_answers,
    decode_generate_batch,
    decode_one,
    encode_answers,
    encode_error,
    failure_of_one,
)
from protocols.ws_events import FrameEvents, decode_starts

DEFAULTS = SamplingOptions(max_new_tokens=64, temperature=0.7)


def finished_with(new: str, full: str, *, eos: bool, reason: str, elapsed: float = 0.1) -> Finished:
    """A prompt's end: one new token, `new`, after the rest of `full`."""
    after = History(token_array([1, 2]), full, eos)
    sequence = GeneratedSequence(new, 1, reason)
    return Finished(0, after, [sequence], prompt_tokens=1, execution_time=elapsed)


def body(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def test_absent_fields_take_the_servers_defaults_and_given_ones_win() -> None:
    batch = decode_batch(
        body(
            prompts=[{"request_id": "a", "prompt": "p"}],
            generation_config={"top_k": 5, "stop": ["\n"]},
        ),
        DEFAULTS,
    )
    assert batch.items == [PromptItem("a", "p")]
    assert batch.options.max_new_tokens == 64 and batch.options.temperature == 0.7
    assert batch.options.top_k == 5 and batch.options.stop == ("\n",)
    assert batch.only_new_tokens is True and batch.stream is True


def test_errors_name_the_json_path() -> None:
    batch = decode_batch(
        body(
            prompts=[
                {"request_id": "a", "prompt": "p"},
                {"prompt": "q"},
                {"request_id": "c", "prompt": 3},
            ]
        ),
        DEFAULTS,
    )
    assert [r.request_id for r in batch.rejected] == [None, "c"]
    assert [r.error.field for r in batch.rejected] == [
        "$.prompts[1].request_id",
        "$.prompts[2].prompt",
    ]
    assert batch.rejected[1].error.message.endswith(" - at `$.prompts[2].prompt`")


def test_a_bad_generation_config_fails_every_prompt_by_its_id() -> None:
    batch = decode_batch(
        body(
            prompts=[{"request_id": "a", "prompt": "p"}, {"request_id": "b", "prompt": "q"}],
            generation_config={"max_new_tokens": 0},
        ),
        DEFAULTS,
    )
    assert batch.items == []
    assert [r.request_id for r in batch.rejected] == ["a", "b"]
    assert all(r.error.field == "$.generation_config.max_new_tokens" for r in batch.rejected)


@pytest.mark.parametrize("raw", [b"", b"nope", b"[1, 2]", b'{"prompts": {}}', b'{"prompts": []}'])
def test_a_payload_that_names_no_prompt_fails_whole(raw: bytes) -> None:
    with pytest.raises(GenerationError) as caught:
        decode_batch(raw, DEFAULTS)
    assert caught.value.kind is ErrorKind.INVALID_REQUEST and caught.value.field


def test_streaming_beam_search_is_the_specs_error_but_non_streaming_is_fine() -> None:
    prompts = [{"request_id": "a", "prompt": "p"}]
    streaming = decode_batch(body(prompts=prompts, generation_config={"num_beams": 2}), DEFAULTS)
    assert streaming.rejected[0].error.message == STREAMING_BEAM_SEARCH_ERROR
    quiet = decode_batch(
        body(prompts=prompts, stream_response=False, generation_config={"num_beams": 2}), DEFAULTS
    )
    assert quiet.options.num_beams == 2 and not quiet.rejected


def test_payload_frames_send_each_phase_once_for_every_accepted_prompt() -> None:
    items = [PromptItem("a", "pa"), PromptItem("b", "pb"), PromptItem("c", "pc")]
    undecodable = Rejected("z", invalid("bad", "$.prompts[3].prompt"), 3)
    frames = PayloadFrames(items, [undecodable], only_new_tokens=False)

    def sent(*step: Event) -> list[list[tuple[str, str | None]]]:
        wire = [[msgspec.to_builtins(e) for e in frame] for frame in frames.frames(step)]
        return [[(e["type"], e["request_id"]) for e in frame] for frame in wire]

    too_long = Failed(2, ErrorKind.CONTEXT_LENGTH_EXCEEDED, "too long", "prompt")
    assert sent(Queued(0)) == []  # b and c are not checked yet
    assert sent(Queued(1), too_long) == [
        [("ACCEPTED", "a"), ("ACCEPTED", "b")],
        [("ERROR", "z"), ("ERROR", "c")],
    ]
    assert sent(Started(1)) == []
    assert sent(Started(0), Initialized(0, "pa"), Delta(0, "x", [7])) == [
        [("STARTED", "a"), ("STARTED", "b")]
    ]
    step: list[Event] = [Initialized(1, "pb"), Delta(1, "y", [8]), Delta(0, "z", [9])]
    out = frames.frames(step)
    assert [[msgspec.to_builtins(e) for e in frame] for frame in out] == [
        [
            {"type": "INITIALIZED", "request_id": "a", "text": "pa"},
            {"type": "INITIALIZED", "request_id": "b", "text": "pb"},
        ],
        [
            {"type": "PROGRESS", "request_id": "a", "text": "xz"},
            {"type": "PROGRESS", "request_id": "b", "text": "y"},
        ],
    ]
    assert decode_frame(encode_frame(out[1])) == out[1]
    assert sent(finished_with("xz", "paxz", eos=False, reason="length")) == []
    boom = Failed(1, ErrorKind.ENGINE_ERROR, "boom")
    assert sent(boom) == [[("COMPLETE", "a")], [("ERROR", "b")]]
    assert frames.abandon("too late") == []  # every prompt has had its end


def test_rest_payloads_and_answers() -> None:
    one = decode_one(body(request_id="r", prompt="p", stream_response=False), DEFAULTS)
    assert one.item == PromptItem("r", "p") and not one.stream
    with pytest.raises(GenerationError) as caught:
        decode_one(body(request_id="r"), DEFAULTS)
    assert caught.value.field == "$.prompt"
    finished = finished_with("new", "old new", eos=True, reason="stop")
    item = PromptItem("r", "ignored")
    too_long = Failed(1, ErrorKind.CONTEXT_LENGTH_EXCEEDED, "too long", "prompt")
    assert failure_of_one(too_long).field == "$.prompt"
    assert json.loads(
        encode_answers(
            [
                answer_of(item, finished, position=0, only_new_tokens=True),
                answer_of(item, finished, position=0, only_new_tokens=False),
                answer_of(item, too_long, position=3, only_new_tokens=True),
            ]
        )
    ) == [
        {"request_id": "r", "response": "new"},
        {"request_id": "r", "prompt": "old ", "response": "new"},
        {"request_id": "r", "response": "", "error": "too long", "field": "$.prompts[3].prompt"},
    ]


def test_batch_answers_keep_the_payloads_order() -> None:
    batch = decode_generate_batch(
        body(prompts=[{"request_id": "a"}, {"request_id": "b", "prompt": "p"}, {"prompt": 1}]),
        DEFAULTS,
    )
    assert batch.positions == [1]
    finished = finished_with("new", "pnew", eos=False, reason="length")
    answers = json.loads(encode_answers(batch_answers(batch, {0: finished})))
    assert [a["request_id"] for a in answers] == ["a", "b", None]
    assert answers[1] == {"request_id": "b", "response": "new"}
    assert answers[0]["field"] == "$.prompts[0].prompt"
    assert answers[2]["field"] == "$.prompts[2].prompt"


def test_error_body() -> None:
    error = GenerationError(ErrorKind.RATE_LIMITED, "busy")
    assert json.loads(encode_error(error)) == {"error": "busy", "type": "rate_limited"}


def test_a_request_id_twice_refuses_the_whole_ws_payload_once_per_id() -> None:
    prompts = [
        {"request_id": "a", "prompt": "p"},
        {"request_id": "b", "prompt": 5},
        {"request_id": "a", "prompt": "q"},
        {"request_id": "c", "prompt": "r"},
        {"prompt": "no id"},
    ]
    batch = refuse_repeated_ids(decode_batch(body(prompts=prompts), DEFAULTS))
    assert not batch.items
    frames = PayloadFrames(batch.items, batch.rejected, only_new_tokens=True).frames([])
    twice = "request_id 'a' appears more than once in the payload: none of its prompts ran"
    [events] = [[msgspec.to_builtins(e) for e in frame] for frame in frames]
    assert [(e["type"], e["request_id"]) for e in events] == [
        ("ERROR", "a"),
        ("ERROR", "b"),
        ("ERROR", "c"),
        ("ERROR", ""),
    ]
    assert events[0]["error"] == events[2]["error"] == twice
    # the rest are msgspec's reasons (its wording is its own), placed by the gateway
    assert events[1]["error"].endswith(" - at `$.prompts[1].prompt`")
    assert events[3]["error"].endswith(" - at `$.prompts[4]`")
    assert "request_id" in events[3]["error"]
    once = decode_batch(body(prompts=prompts[3:4]), DEFAULTS)
    assert refuse_repeated_ids(once) is once


def test_ws_events_echo_only_the_starts_that_passed_their_checks() -> None:
    starts = [
        {"type": "START", "id": "ok", "data": "p"},
        {"type": "START", "id": "empty", "data": ""},
        {"type": "START", "id": "twice", "data": "p"},
        {"type": "START", "id": "long", "data": "p"},
        {"type": "START", "id": "twice", "data": "q"},
    ]
    accepted, refused = decode_starts(json.dumps(starts), DEFAULTS)
    assert [a.start.id for a in accepted] == ["ok", "long"]
    frames = FrameEvents(accepted, refused)

    def sent(*step: Event) -> list[list[dict[str, object]]]:
        return [[msgspec.to_builtins(e) for e in frame] for frame in frames.frames(step)]

    assert sent() == []  # neither is checked yet
    too_long = Failed(1, ErrorKind.CONTEXT_LENGTH_EXCEEDED, "too long", "$[3].data")
    assert sent(Queued(0), Delta(0, "x", [1]), too_long) == [
        [{"type": "START", "id": "ok", "data": "p"}],
        [
            {
                "type": "ERROR",
                "id": "empty",
                "data": "A START needs a prompt: `data` is empty - at `$[1].data`",
                "field": "$[1].data",
            },
            {
                "type": "ERROR",
                "id": "twice",
                "data": "id 'twice' appears more than once in the frame: no START of it ran",
                "field": "$[2].id",
            },
            {"type": "ERROR", "id": "long", "data": "too long", "field": "$[3].data"},
        ],
        [{"type": "PROGRESS", "id": "ok", "data": "x"}],
    ]
    [running], [] = decode_starts(json.dumps(starts[0]), DEFAULTS)
    busy = FrameEvents([running], [])
    duplicate = Failed(0, ErrorKind.DUPLICATE_REQUEST_ID, "'events:ok' is busy", "request_id")
    [[error]] = busy.frames([duplicate])
    assert msgspec.to_builtins(error) == {
        "type": "ERROR",
        "id": "ok",
        "data": "id 'ok' is already generating: wait for its end, or use another id",
        "field": "$.id",
    }
