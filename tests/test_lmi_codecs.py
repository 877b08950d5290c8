"""The LMI, TGI and SageMaker event-stream codecs, without a server."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import pytest
from botocore.eventstream import EventStreamBuffer  # type: ignore[import-untyped]

from protocols.errors import GenerationError, invalid
from protocols.events import Finished, GeneratedSequence, History, TokenInfo, TopToken, token_array
from protocols.eventstream import model_error, model_stream_error, payload_part
from protocols.lmi import payload_error
from protocols.lmi_adapters import MAX_PAGE, page
from protocols.lmi_answers import LmiEncoder
from protocols.lmi_requests import InvalidPayload, LmiRequest, decode_lmi, output_form
from protocols.tgi import TgiEncoder, decode_tgi, error_body, error_event

PROMPT = "What is Deep Learning?"


def lmi(body: dict[str, Any], formatter: str = "", tgi_compat: bool = False) -> LmiRequest:
    raw = json.dumps(body)
    return decode_lmi(raw, formatter=formatter, tgi_compat=tgi_compat, max_new_tokens=30)


def refused(body: dict[str, Any], formatter: str = "") -> InvalidPayload:
    with pytest.raises(InvalidPayload) as caught:
        lmi(body, formatter)
    return caught.value


def tokens() -> list[TokenInfo]:
    alternatives = (TopToken(11, " Learning", -0.5), TopToken(12, " learning", -2.0))
    return [TokenInfo(10, "Deep", -0.25), TokenInfo(11, " Learning", -1.5, alternatives)]


def finished(**extra: Any) -> Finished:
    fields: dict[str, Any] = {
        "sequences": [GeneratedSequence("Deep Learning", 2, "length", None, tokens())],
        **extra,
    }
    history = History(token_array(range(7)), PROMPT + "Deep Learning")
    return Finished(index=0, history=history, prompt_tokens=5, execution_time=0.1, **fields)


def test_rolling_and_dynamic_schemas_and_lmi_defaults() -> None:
    rolling = lmi({"inputs": PROMPT})
    assert (rolling.inputs, rolling.dynamic, rolling.output) == ([PROMPT], False, "json")
    options = rolling.options
    assert options.max_new_tokens == 30 and not options.do_sample and options.top_k == 0
    assert options.logprobs is None  # nothing shows token log-probabilities
    assert not rolling.details and not rolling.return_full_text
    dynamic = lmi({"inputs": [PROMPT, "Hi"], "parameters": {"max_new_tokens": 5}})
    assert dynamic.dynamic and dynamic.inputs == [PROMPT, "Hi"]
    assert dynamic.options.max_new_tokens == 5
    assert lmi({"inputs": PROMPT}, tgi_compat=True).details  # DJL: details default on in TGI mode


def test_every_parameter_maps_onto_the_engine_options() -> None:
    params = {
        "do_sample": True,
        "seed": 7,
        "temperature": 0.5,
        "repetition_penalty": 1.2,
        "top_k": 5,
        "top_p": 0.9,
        "max_new_tokens": 12,
        "stop_sequences": ["\n\n"],
        "min_p": 0.05,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "stop_token_ids": [2],
        "include_stop_str_in_output": True,
        "ignore_eos_token": True,
        "logprobs": 3,
        "prompt_logprobs": 1,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "typical_p": 0.95,
        "truncate": 100,
        "length_penalty": 1.0,
        "early_stopping": False,
    }
    request = lmi({"inputs": PROMPT, "parameters": params})
    o = request.options
    assert (o.do_sample, o.seed, o.temperature, o.top_k, o.top_p) == (True, 7, 0.5, 5, 0.9)
    assert o.typical_p == 0.95
    assert (o.repetition_penalty, o.min_p, o.presence_penalty, o.frequency_penalty) == (
        1.2,
        0.05,
        0.5,
        -0.5,
    )
    assert (o.max_new_tokens, o.stop, o.stop_token_ids) == (12, ("\n\n",), (2,))
    assert o.include_stop_str_in_output and o.ignore_eos
    assert (o.logprobs, o.prompt_logprobs, request.top_n) == (3, 1, 3)
    assert not o.skip_special_tokens and not o.spaces_between_special_tokens
    # epsilon_cutoff is a GenerationConfig field vLLM cannot honour: accepted and ignored.
    ignored = lmi(
        {"inputs": PROMPT, "parameters": {"epsilon_cutoff": 0.01, "early_stopping": True}}
    )
    assert ignored.options.early_stopping is True
    assert request.truncate == 100


def test_sequences_returned_for_n_best_of_and_beams() -> None:
    def plan(**params: Any) -> tuple[int, int, bool]:
        p = lmi({"inputs": PROMPT, "parameters": {"do_sample": True, **params}})
        return p.options.n, p.returned, p.options.num_beams > 1

    assert plan(n=3) == (3, 3, False)
    assert plan(best_of=4, n=2) == (4, 2, False)  # the best n of best_of
    assert plan(best_of=3) == (3, 3, False)  # n = 1: every best_of sequence is answered
    assert plan(num_beams=3) == (3, 3, True)
    assert plan(num_beams=3, n=2) == (3, 2, True)
    asked = lmi({"inputs": PROMPT, "parameters": {"do_sample": True, "best_of": 4, "n": 2}}).asked
    assert [(a.name, a.count, a.field) for a in asked] == [
        ("n", 2, "$.parameters.n"),
        ("best_of", 4, "$.parameters.best_of"),
    ]


def test_output_forms_follow_stream_formatter_and_tgi_mode() -> None:
    assert output_form(None, "", False) == "json"
    assert output_form(True, "", False) == "jsonlines"
    assert output_form(True, "", True) == "sse"
    assert output_form(None, "sse", False) == "sse"
    assert output_form(False, "jsonlines", False) == "jsonlines"
    assert output_form(True, "json", False) == "json"


@dataclass(frozen=True)
class Placed:
    """A reason in msgspec's words (its own: not asserted), which the gateway places with its
    " - at `...`" (protocols/errors.py): at the field, or (`at`) at the object that lacks the
    key or holds the unknown one."""

    at: str = ""


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"inputs": PROMPT, "parameters": {"top_k": "x"}}, "$.parameters.top_k", Placed()),
        (
            {"inputs": PROMPT, "parameters": {"temperature": -1}},
            "$.parameters.temperature",
            Placed(),
        ),
        (
            {"inputs": PROMPT, "parameters": {"topk": 1}},
            "$.parameters.topk",
            Placed("$.parameters"),
        ),
        ({"inputs": PROMPT, "extra": 1}, "$.extra", Placed("$")),
        ({"parameters": {}}, "$.inputs", Placed("$")),
        ({"inputs": ""}, "$.inputs", Placed()),
        ({"inputs": PROMPT, "parameters": {"n": 2}}, "$.parameters.n", "do_sample"),
        (
            {"inputs": PROMPT, "parameters": {"do_sample": True, "n": 3, "best_of": 2}},
            "$.parameters.best_of",
            "at least n",
        ),
        (
            {"inputs": PROMPT, "parameters": {"num_beams": 2, "stop_sequences": ["x"]}},
            "$.parameters.stop_sequences",
            "beam search",
        ),
        (
            {"inputs": PROMPT, "parameters": {"num_beams": 2, "best_of": 2, "do_sample": True}},
            "$.parameters.best_of",
            "num_beams",
        ),
        ({"inputs": PROMPT, "parameters": {"seed": 2**70}}, "$.parameters.seed", Placed()),
        (  # each id is looked for in the list at every step: as long as MAX_STOP_SEQUENCES
            {"inputs": PROMPT, "parameters": {"stop_token_ids": list(range(17))}},
            "$.parameters.stop_token_ids",
            "At most 16 stop token ids",
        ),
    ],
)
def test_bad_payloads_name_the_field(body: dict[str, Any], field: str, words: str | Placed) -> None:
    error = refused(body).error
    assert error.field == field
    assert field.split(".")[-1] in error.message  # the wire's `error` names it
    if isinstance(words, Placed):
        reason, _, at = error.message.rpartition(" - at `")
        assert reason and at == f"{words.at or field}`", error.message
    else:
        assert words in error.message


def test_streaming_refusals_and_the_dynamic_flag() -> None:
    for name in ("n", "best_of", "num_beams"):
        body = {"inputs": PROMPT, "stream": True, "parameters": {"do_sample": True, name: 2}}
        assert "without streaming" in refused(body).error.message
    assert (
        "without streaming"
        in refused({"inputs": PROMPT, "parameters": {"n": 2}}, "sse").error.message
    )
    bad_entry = refused({"inputs": [PROMPT, 5]})
    assert bad_entry.dynamic and bad_entry.error.field == "$.inputs[1]"
    details = refused({"inputs": [PROMPT], "stream": True, "parameters": {"details": True}})
    assert details.dynamic and details.error.field == "$.parameters.details"
    assert not refused({"inputs": 5}).dynamic


def test_a_bad_parameter_value_is_a_failed_generation_but_a_bad_payload_is_not() -> None:
    value = {"inputs": PROMPT, "parameters": {"temperature": -1}}
    assert refused(value).output == "json"  # the spec's "bad generation parameter value"
    assert refused(value | {"stream": True}).output == "jsonlines"
    assert refused(value, "sse").output == "sse"
    combination = {"inputs": PROMPT, "stream": True, "parameters": {"num_beams": 2}}
    assert refused(combination).output == "jsonlines"
    for payload in (
        {"inputs": PROMPT, "parameters": {"temperature": "hot"}},
        {"inputs": PROMPT, "parameters": {"temprature": 1}},
        {"inputs": PROMPT, "parameters": [1]},
        {"inputs": ""},
        {"inputs": PROMPT, "extra": 1},
    ):
        assert refused(payload).output is None, payload  # payload validation


def test_error_bodies_are_the_specs() -> None:
    assert json.loads(payload_error("bad", 424, dynamic=False)) == {"error": "bad", "code": 424}
    assert json.loads(payload_error("bad", 424, dynamic=True)) == {
        "code": 424,
        "message": "invoke handler failure",
        "error": "bad",
    }
    line = json.loads(LmiEncoder(lmi({"inputs": PROMPT, "stream": True})).failed_line("boom"))
    assert line == {
        "token": {"id": -1, "text": "", "log_prob": -1, "special_token": True, "error_msg": "boom"},
        "generated_text": "",
        "details": {"finish_reason": "error", "generated_tokens": None, "inputs": None},
    }
    whole = json.loads(LmiEncoder(lmi({"inputs": PROMPT})).failed_answer("boom"))
    assert whole == {
        "generated_text": "",
        "details": {
            "finish_reason": "error",
            "generated_tokens": None,
            "inputs": None,
            "tokens": None,
            "error_msg": "boom",
        },
    }


def test_json_answer_with_details_prefill_and_alternatives() -> None:
    request = lmi(
        {
            "inputs": PROMPT,
            "parameters": {"details": True, "decoder_input_details": True, "logprobs": 1},
        }
    )
    prefill = [TokenInfo(2, "<s>", math.nan, special=True), TokenInfo(9, "What", -3.0)]
    encoder = LmiEncoder(request)
    doc = json.loads(encoder.document([encoder.answer(PROMPT, finished(prefill=prefill))]))
    assert doc["generated_text"] == "Deep Learning"
    details = doc["details"]
    assert (details["finish_reason"], details["generated_tokens"], details["inputs"]) == (
        "length",
        2,
        PROMPT,
    )
    assert details["tokens"][0] == {
        "id": 10,
        "text": "Deep",
        "log_prob": -0.25,
        "top_tokens": [{"id": 10, "text": "Deep", "log_prob": -0.25}],
    }
    assert details["tokens"][1]["top_tokens"] == [{"id": 11, "text": " Learning", "log_prob": -0.5}]
    assert details["prefill"][0] == {
        "id": 2,
        "text": "<s>",
        "log_prob": None,
        "special_token": True,
    }
    assert "best_of_sequences" not in details


def test_stream_lines_end_with_generated_text_and_details() -> None:
    request = lmi(
        {
            "inputs": PROMPT,
            "stream": True,
            "parameters": {"details": True, "return_full_text": True},
        }
    )
    encoder = LmiEncoder(request)
    assert encoder.media_type == "application/jsonlines"
    body = encoder.lines(PROMPT, tokens(), finished())
    first, last = (json.loads(line) for line in body.decode().splitlines())
    assert first == {"token": {"id": 10, "text": "Deep", "log_prob": -0.25}}
    assert last["generated_text"] == PROMPT + "Deep Learning"
    assert last["details"] == {"finish_reason": "length", "generated_tokens": 2, "inputs": PROMPT}
    sse = LmiEncoder(lmi({"inputs": PROMPT}, "sse")).lines(PROMPT, tokens()[:1], None)
    assert sse == b'data: {"token":{"id":10,"text":"Deep","log_prob":-0.25}}\n\n'


def test_tgi_compat_mode_renames_and_wraps() -> None:
    request = lmi({"inputs": PROMPT}, tgi_compat=True)
    encoder = LmiEncoder(request)
    doc = json.loads(encoder.document([encoder.answer(PROMPT, finished())]))
    assert isinstance(doc, list) and doc[0]["generated_text"] == "Deep Learning"
    assert doc[0]["details"]["tokens"][0] == {
        "id": 10,
        "text": "Deep",
        "logprob": -0.25,
        "special": False,
    }
    stream = LmiEncoder(lmi({"inputs": PROMPT, "stream": True}, tgi_compat=True))
    assert stream.media_type == "text/event-stream"
    failed = stream.failed_line("boom").decode()
    assert failed.startswith("data: ") and failed.endswith("\n\n")
    line = json.loads(failed.removeprefix("data: "))
    assert line["error"] == "boom" and line["details"]["finish_reason"] == "error"
    assert line["token"] == {"id": -1, "text": "", "logprob": -1, "special": True}


def test_tgi_decoding_infers_sampling_and_enforces_its_limits() -> None:
    def call(stream: bool | None = False, **params: Any) -> Any:
        body = json.dumps({"inputs": PROMPT, "parameters": params})
        return decode_tgi(body, stream=stream, full_text_default=False, max_new_tokens=20)

    assert not call().options.do_sample
    assert call(temperature=0.5).options.do_sample
    assert not call(temperature=1.0).options.do_sample
    assert call(top_k=3).options.do_sample
    assert call(typical_p=0.5).options.do_sample and call(typical_p=0.5).options.typical_p == 0.5
    sampled = call(best_of=2, do_sample=True, details=True)
    assert sampled.options.n == 2
    # best_of names itself for MAX_BEST_OF, a setting held on the engine path.
    [asked] = call(best_of=3, do_sample=True).asked
    assert (asked.name, asked.count, asked.field) == ("best_of", 3, "$.parameters.best_of")
    assert call(decoder_input_details=True).details
    assert call(adapter_id="sql").adapter == "sql"  # known or not: the engine path checks it
    refusals: list[tuple[dict[str, Any], str]] = [
        ({"temperature": 0}, "temperature"),
        ({"top_p": 1.0}, "top_p"),
        ({"typical_p": 1.0}, "typical_p"),
        ({"best_of": 2}, "best_of"),
        ({"best_of": 2, "do_sample": True, "seed": 1}, "seed"),
        ({"watermark": True}, "watermark"),
        ({"grammar": {"type": "xml", "value": "a"}}, "grammar.type"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"top_n_tokens": 6}, "top_n_tokens"),
        ({"nope": 1}, "nope"),
    ]
    for params, name in refusals:
        with pytest.raises(GenerationError) as caught:
            call(**params)
        assert caught.value.field == f"$.parameters.{name}", params
        assert name.split(".")[-1] in caught.value.message, params
    with pytest.raises(GenerationError) as caught:
        call(best_of=2)
    assert "sampling" in caught.value.message  # the gateway's (TGI's) reason
    with pytest.raises(GenerationError, match="decoder_input_details"):
        call(stream=True, decoder_input_details=True)
    # transformers' GenerationConfig fields are accepted; those vLLM cannot honour, ignored.
    assert call(epsilon_cutoff=0.01, num_beams=4).options.num_beams == 1
    streamed = json.dumps({"inputs": PROMPT, "stream": True, "parameters": {"best_of": 2}})
    with pytest.raises(GenerationError, match="streaming"):
        decode_tgi(streamed, stream=None, full_text_default=True, max_new_tokens=20)


def test_tgi_answers_and_stream_events() -> None:
    body = json.dumps({"inputs": PROMPT, "parameters": {"details": True, "top_n_tokens": 1}})
    call = decode_tgi(body, stream=False, full_text_default=True, max_new_tokens=20)
    doc = json.loads(TgiEncoder(call).document(finished(), listed=True))
    answer = doc[0]
    assert answer["generated_text"] == PROMPT + "Deep Learning"
    details = answer["details"]
    assert details["tokens"][1] == {
        "id": 11,
        "text": " Learning",
        "logprob": -1.5,
        "special": False,
    }
    assert details["top_tokens"][1] == [
        {"id": 11, "text": " Learning", "logprob": -0.5, "special": False}
    ]
    assert details["prefill"] == [] and details["seed"] is None
    stream_call = decode_tgi(
        json.dumps({"inputs": PROMPT, "parameters": {"details": True}}),
        stream=True,
        full_text_default=False,
        max_new_tokens=20,
    )
    encoder = TgiEncoder(stream_call)
    raw = encoder.events(tokens()[:1], None)
    raw += encoder.events(tokens()[1:], finished())
    events = [json.loads(e.removeprefix("data: ")) for e in raw.decode().split("\n\n") if e]
    assert [e["index"] for e in events] == [1, 2]
    assert events[0]["generated_text"] is None and events[0]["details"] is None
    assert events[1]["generated_text"] == "Deep Learning"
    assert events[1]["details"] == {
        "finish_reason": "length",
        "generated_tokens": 2,
        "seed": None,
        "input_length": 5,
    }


def test_best_of_ranks_by_total_log_probability_in_lmi_and_by_mean_in_tgi() -> None:
    short = GeneratedSequence("A", 1, "stop", None, [TokenInfo(5, "A", -1.0)])
    long = GeneratedSequence("B C", 2, "length", None, [TokenInfo(6, "B", -0.6)] * 2)
    both = finished(sequences=[short, long])  # total: A -1.0 > B C -1.2; mean: B C -0.6 first
    params = {"do_sample": True, "best_of": 2, "details": True}
    lmi_doc = LmiEncoder(lmi({"inputs": PROMPT, "parameters": params})).answer(PROMPT, both)
    assert lmi_doc.generated_text == "A"
    body = json.dumps({"inputs": PROMPT, "parameters": params})
    call = decode_tgi(body, stream=False, full_text_default=False, max_new_tokens=20)
    tgi_doc = json.loads(TgiEncoder(call).document(both, listed=False))
    assert tgi_doc["generated_text"] == "B C"
    assert [s["generated_text"] for s in tgi_doc["details"]["best_of_sequences"]] == ["A"]


def test_beams_keep_the_searchs_order() -> None:
    # A beam's score is its log-probability over its length: the short one's total is higher.
    short = GeneratedSequence("A", 1, "stop", None, [TokenInfo(5, "A", -1.0)])
    long = GeneratedSequence("B C", 2, "length", None, [TokenInfo(6, "B", -0.6)] * 2)
    params = {"num_beams": 2, "details": True}
    doc = LmiEncoder(lmi({"inputs": PROMPT, "parameters": params})).answer(
        PROMPT, finished(sequences=[long, short])
    )
    assert doc.generated_text == "B C"
    assert doc.details and [t.log_prob for t in doc.details.tokens or ()] == [-0.6, -0.6]


def test_tgi_error_shapes() -> None:
    assert error_body(invalid("bad - at `$.x`")) == (
        422,
        b'{"error":"Input validation error: bad - at `$.x`","error_type":"validation"}',
    )
    event = error_event(invalid("bad"))
    assert event.startswith(b"data: {") and event.endswith(b"}\n\n") and event.count(b"\n") == 2


def test_event_stream_frames_parse_with_botocore() -> None:
    buffer = EventStreamBuffer()
    buffer.add_data(payload_part(b'{"token": 1}\n') + model_stream_error("it broke"))
    part, error = list(buffer)
    assert part.headers == {
        ":event-type": "PayloadPart",
        ":content-type": "application/octet-stream",
        ":message-type": "event",
    }
    assert part.payload == b'{"token": 1}\n'
    assert error.headers[":message-type"] == "exception"
    assert error.headers[":exception-type"] == "ModelStreamError"
    assert json.loads(error.payload) == {"Message": "it broke", "ErrorCode": "StreamBroken"}
    body = json.loads(model_error(424, b'{"error":"x","code":424}'))
    assert (
        body["OriginalStatusCode"] == 424 and body["OriginalMessage"] == '{"error":"x","code":424}'
    )


@pytest.mark.parametrize("limit", ["0", "-1", "101", "1000", ""])
def test_an_adapter_page_past_djls_range_is_100_and_following_its_tokens_ends(limit: str) -> None:
    """DJL's ListPagination, whose limit of 0 would answer an empty page with the same token
    for ever: below 1 or above 100, a page is 100 (DJL's rule for its out-of-range limits)."""
    count, first, pages = 250, 0, 0
    while True:
        first, last = page({"limit": limit, "next_page_token": str(first)}, count)
        assert last - first == min(MAX_PAGE, count - first)
        pages += 1
        if last >= count:
            break
        first = last
    assert pages == 3
