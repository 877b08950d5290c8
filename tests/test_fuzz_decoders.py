"""Every `protocols/` decoder of client input, fed random and mutated JSON: it answers, or
raises its protocol's own error naming where the body is wrong; nothing else escapes.

Pure: no engine, no server. The HTTP and WebSocket sides are tests/test_fuzz_http.py and
tests/test_fuzz_ws.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from numbers_past_bounds import (
    Place,
    Schema,
    field_name,
    numeric_places,
    past_bounds,
    with_number,
)

from protocols import control, lmi, tgi, ws_events
from protocols.anthropic_requests import decode_messages
from protocols.batch_payload import BatchRequest, PayloadSettings, decode_batch
from protocols.cohere_chat import decode_chat as decode_cohere_chat
from protocols.errors import GenerationError
from protocols.generation import SamplingOptions
from protocols.lmi_requests import InvalidPayload, decode_lmi, is_chat
from protocols.ollama_models import OllamaEmbedRequest
from protocols.ollama_models import decode_embed as decode_ollama_embed
from protocols.ollama_requests import OllamaChatRequest, OllamaGenerateRequest
from protocols.ollama_requests import decode_chat as decode_ollama_chat
from protocols.ollama_requests import decode_generate as decode_ollama_generate
from protocols.openai_requests import ChatRequest, CompletionRequest, decode_chat, decode_completion
from protocols.responses_requests import ResponsesRequest, decode_responses
from protocols.rest_generate import _OnePayload, decode_generate_batch, decode_one
from protocols.tgi import decode_tgi

Raw = bytes | str
DEFAULTS = SamplingOptions(max_new_tokens=4)
DEEP = 50_000


def _bytes(raw: Raw) -> bytes:
    """An HTTP body is bytes: a str's lone surrogates become the invalid UTF-8 they would be."""
    return raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")


def _lmi(raw: Raw) -> object:
    try:
        return decode_lmi(raw, formatter="", tgi_compat=False, max_new_tokens=30)
    except InvalidPayload as e:  # LMI's own error wraps the neutral one
        raise e.error from e


def _starts(raw: Raw) -> object:
    accepted, errors = ws_events.decode_starts(raw, DEFAULTS)
    assert accepted or errors  # an ERROR event is the protocol's way to refuse
    return accepted


# Each decoder of client input with a body it accepts, the seed of the mutations below.
DECODERS: dict[str, tuple[Callable[[Raw], object], dict[str, Any]]] = {
    "lmi": (_lmi, {"inputs": "Hi", "parameters": {"max_new_tokens": 4, "details": True}}),
    "lmi.is_chat": (
        lambda raw: is_chat(_bytes(raw)),
        {"messages": [{"role": "user", "content": "Hi"}]},
    ),
    "tgi": (
        lambda raw: decode_tgi(raw, stream=None, full_text_default=True, max_new_tokens=30),
        {"inputs": "Hi", "parameters": {"max_new_tokens": 4, "top_n_tokens": 2}},
    ),
    "openai.chat": (
        lambda raw: decode_chat(_bytes(raw), 2048),
        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "logprobs": True},
    ),
    "openai.completion": (
        lambda raw: decode_completion(_bytes(raw), 2048),
        {"prompt": ["Hi", "b"], "max_tokens": 4, "n": 2, "stop": ["x"]},
    ),
    "openai.responses": (
        lambda raw: decode_responses(_bytes(raw), 2048),
        {
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c", "output": "x"},
            ],
            "max_output_tokens": 4,
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "text": {"format": {"type": "json_object"}},
            "metadata": {"a": "b"},
        },
    ),
    "anthropic.messages": (
        lambda raw: decode_messages(_bytes(raw)),
        {
            "model": "m",
            "max_tokens": 4,
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}],
                },
            ],
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        },
    ),
    "cohere.chat": (
        lambda raw: decode_cohere_chat(_bytes(raw), 2048),
        {
            "model": "m",
            "max_tokens": 4,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        },
    ),
    "ollama.chat": (
        lambda raw: decode_ollama_chat(_bytes(raw), 2048),
        {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "options": {"seed": 1}},
    ),
    "ollama.generate": (
        lambda raw: decode_ollama_generate(_bytes(raw), 2048),
        {"model": "m", "prompt": "Hi", "context": [1], "options": {"num_predict": 4}},
    ),
    "ollama.embed": (
        lambda raw: decode_ollama_embed(_bytes(raw), dimensions_supported=True),
        {"model": "m", "input": ["Hi"], "dimensions": 8},
    ),
    "control.client": (
        control.decode_client,
        {"type": "config", "prompt": "Hi", "parameters": {"max_tokens": 4}},
    ),
    "control.rest": (
        lambda raw: control.rest_config(_bytes(raw)),
        {"prompt": "Hi", "max_tokens": 4, "options": {"include_timing": True}},
    ),
    "batch": (
        lambda raw: decode_batch(raw, DEFAULTS),
        {
            "prompts": [{"request_id": "a", "prompt": "Hi"}],
            "generation_config": {"max_new_tokens": 4, "stop": ["x"]},
        },
    ),
    "rest.one": (
        lambda raw: decode_one(_bytes(raw), DEFAULTS),
        {"request_id": "a", "prompt": "Hi", "generation_config": {"max_new_tokens": 4}},
    ),
    "rest.batch": (
        lambda raw: decode_generate_batch(_bytes(raw), DEFAULTS),
        {"prompts": [{"request_id": "a", "prompt": "Hi"}], "only_new_tokens": False},
    ),
    "ws_events": (
        _starts,
        {"type": "START", "id": "1", "data": "Hi", "parameters": {"max_new_tokens": 4}},
    ),
}
NAMES = sorted(DECODERS)

# JSON values, huge and odd ones included; NaN and infinities become the non-JSON literals
# Python's json writes for them.
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats()
    | st.text()
    | st.sampled_from(["", "\x00", "é", "\U0001f600", "$", "START", "config", "user"])
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=20,
)


def _decodes(name: str, raw: Raw) -> None:
    """The decoder answers, or raises a GenerationError that says where and why."""
    decode = DECODERS[name][0]
    try:
        decode(raw)
    except GenerationError as e:
        assert e.message, e
        assert e.field is None or e.field, e


def _paths(doc: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a document a mutation can reach."""
    found = [at]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += _paths(value, (*at, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            found += _paths(value, (*at, i))
    return found


def _replace(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    head, *rest = path
    copy = dict(doc) if isinstance(doc, dict) else list(doc)
    copy[head] = _replace(doc[head], tuple(rest), value)
    return copy


@st.composite
def mutated(draw: st.DrawFn, seed: dict[str, Any]) -> bytes:
    """The seed with one place replaced by a random value, or an unknown key added, then
    perhaps with its bytes damaged."""
    path = draw(st.sampled_from(_paths(seed)))
    doc = _replace(seed, path, draw(VALUES))
    if draw(st.booleans()) and isinstance(doc, dict):
        doc = {**doc, draw(st.text(max_size=8)): draw(VALUES)}
    raw = bytearray(json.dumps(doc).encode())
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(raw)))
        raw[at:at] = draw(st.binary(min_size=1, max_size=3))
    return bytes(raw)


FUZZ = settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


@pytest.mark.parametrize("name", NAMES)
@FUZZ
@given(doc=VALUES)
def test_random_json(name: str, doc: Any) -> None:
    _decodes(name, json.dumps(doc).encode())
    _decodes(name, json.dumps(doc, ensure_ascii=False))  # a text frame: a str


@pytest.mark.parametrize("name", NAMES)
@FUZZ
@given(data=st.data())
def test_mutated_payload(name: str, data: st.DataObject) -> None:
    _decodes(name, data.draw(mutated(DECODERS[name][1])))


@pytest.mark.parametrize("name", NAMES)
@FUZZ
@given(raw=st.binary(max_size=64))
def test_random_bytes(name: str, raw: bytes) -> None:
    _decodes(name, raw)


def _wrapped(inner: bytes) -> bytes:
    return b'{"inputs": ' + inner + b', "prompt": ' + inner + b"}"


MALFORMED: dict[str, Raw] = {
    "deep arrays": b"[" * DEEP + b"]" * DEEP,
    "deep arrays in a field": _wrapped(b"[" * DEEP + b"]" * DEEP),
    "deep objects": b'{"a":' * DEEP + b"1" + b"}" * DEEP,
    "deep messages": b'{"messages": ' + b"[" * DEEP + b"]" * DEEP + b"}",
    "invalid UTF-8 in a string": b'{"inputs": "\xff\xfe\xfd", "prompt": "\xff"}',
    "invalid UTF-8 in a key": b'{"\xc3\x28": 1}',
    "truncated UTF-8": b'{"inputs": "\xe2\x82"}',
    "a lone surrogate in a str": '{"inputs": "\ud800", "prompt": "\udfff"}',
    "an escaped lone surrogate": b'{"inputs": "\\ud800", "prompt": "\\udc00x"}',
    "NaN": b'{"inputs": NaN, "max_tokens": NaN}',
    "Infinity": b'{"parameters": {"temperature": Infinity}}',
    "a huge number": b'{"max_tokens": 1e400, "parameters": {"seed": 1e999}}',
    "a huge integer": b'{"max_tokens": ' + b"9" * 5000 + b"}",
    "nothing": b"",
    "a BOM": b'\xef\xbb\xbf{"inputs": "Hi"}',
}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("body", sorted(MALFORMED))
def test_malformed_bodies_are_the_protocols_error(name: str, body: str) -> None:
    _decodes(name, MALFORMED[body])


REFUSING = [n for n in NAMES if n not in ("lmi.is_chat", "ws_events")]  # these answer


def _in_a_field(name: str, value: bytes) -> bytes:
    """The decoder's own valid body with `value` in place of a string it reads."""
    return json.dumps(DECODERS[name][1]).encode().replace(b'"Hi"', value, 1)


@pytest.mark.parametrize("name", REFUSING)
def test_invalid_utf8_is_refused_at_the_body(name: str) -> None:
    with pytest.raises(GenerationError) as refused:
        DECODERS[name][0](_in_a_field(name, b'"\xff\xfe\xfd"'))
    assert refused.value.field == "$"
    assert refused.value.message.startswith("Malformed JSON: not valid UTF-8")


@pytest.mark.parametrize("name", REFUSING)
def test_deep_nesting_is_refused_naming_where(name: str) -> None:
    """A typed field refuses an array at once; where anything goes, the depth is the reason."""
    with pytest.raises(GenerationError) as refused:
        DECODERS[name][0](_in_a_field(name, b"[" * DEEP + b"]" * DEEP))
    assert (refused.value.field or "").startswith("$"), refused.value
    with pytest.raises(GenerationError) as deep:
        DECODERS[name][0](b'{"x": ' + b"[" * DEEP + b"]" * DEEP + b"}")
    assert deep.value.field == "$" and "nested too deeply" in deep.value.message, deep.value


def test_unreadable_frames_are_error_events() -> None:
    for raw in (MALFORMED["deep arrays"], MALFORMED["invalid UTF-8 in a string"]):
        accepted, refused = ws_events.decode_starts(raw, DEFAULTS)
        assert not accepted and refused[0].error.field == "$", refused
        assert refused[0].error.data.startswith("Malformed JSON: ")
    assert not is_chat(_bytes(MALFORMED["deep messages"]))


# --- numbers past their bounds, in each decoder's own types ----------------------------------


class Typed(NamedTuple):
    """A decoder, the type whose numbers it bounds, and a body it accepts."""

    decode: Callable[[Raw], object]
    type: Any
    valid: dict[str, Any]


def _typed(name: str, type_: Any) -> Typed:
    decode, valid = DECODERS[name]
    return Typed(decode, type_, valid)


TYPED: dict[str, Typed] = {
    "lmi": _typed("lmi", lmi._Payload),
    "tgi": _typed("tgi", tgi._Payload),
    "openai.chat": _typed("openai.chat", ChatRequest),
    "openai.completion": _typed("openai.completion", CompletionRequest),
    "openai.responses": _typed("openai.responses", ResponsesRequest),
    "control.config": _typed("control.client", control.Config),
    "control.modify": Typed(
        control.decode_client, control.Control, {"type": "control", "action": "modify"}
    ),
    "control.feedback": Typed(
        control.decode_client, control.Feedback, {"type": "feedback", "rating": 1}
    ),
    "control.rest": _typed("control.rest", control.RestRequest),
    "batch": _typed("batch", PayloadSettings),
    "rest.one": _typed("rest.one", _OnePayload),
    "rest.batch": _typed("rest.batch", PayloadSettings),
    "ws_events": _typed("ws_events", ws_events.StartIn),
    "ollama.chat": _typed("ollama.chat", OllamaChatRequest),
    "ollama.generate": _typed("ollama.generate", OllamaGenerateRequest),
    "ollama.embed": _typed("ollama.embed", OllamaEmbedRequest),
}


def _refusal(name: str, raw: str) -> str:
    """What the decoder says of a body it must refuse: its error's message and field."""
    if name == "ws_events":
        accepted, errors = ws_events.decode_starts(raw, DEFAULTS)
        assert errors and not accepted, accepted
        return f"{errors[0].error.data} {errors[0].error.field}"
    try:
        answer = TYPED[name].decode(raw)
    except GenerationError as e:
        return f"{e.message} {e.field}"
    assert isinstance(answer, BatchRequest), answer  # a batch refuses each of its prompts
    assert answer.rejected and not answer.items, answer
    return f"{answer.rejected[0].error.message} {answer.rejected[0].error.field}"


def _refuses_past_bounds(name: str, place: Place, schema: Schema) -> None:
    explicit, drawn = past_bounds(schema)

    @settings(max_examples=10, deadline=None, database=None, derandomize=True)
    @given(number=drawn)
    def refused(number: str) -> None:
        text = _refusal(name, with_number(TYPED[name].valid, place, number))
        assert field_name(place) in text, (number, text)

    for number in explicit:
        refused = example(number=number)(refused)
    refused()


@pytest.mark.parametrize("name", sorted(TYPED))
def test_every_number_past_its_bounds_is_refused_naming_it(name: str) -> None:
    """Each numeric field of the decoder's type, past its bounds (the nearest numbers, 2^64,
    -2^63 - 1, 1e308, 1e400, and drawn ones), is refused with an error naming the field."""
    schema = msgspec.json.schema(TYPED[name].type)
    places = list(numeric_places(schema, schema.get("$defs", {})))
    assert places, f"{name}: no numbers in {TYPED[name].type}"
    failures: list[str] = []
    for place, field in places:
        try:
            _refuses_past_bounds(name, place, field)
        except (Exception, BaseExceptionGroup) as e:
            failures.append(f"{field_name(place)}: {type(e).__name__}: {e}")
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize(
    ("name", "body", "field"),
    [
        (
            "anthropic.messages",
            {
                "model": "m",
                "max_tokens": 4,
                "messages": [{"role": "user", "content": [{"type": []}]}],
            },
            "messages[0].content[0].type",
        ),
        (
            "cohere.chat",
            {"model": "m", "messages": [{"role": "user", "content": [{"type": []}]}]},
            "messages[0].content[0].type",
        ),
        (
            "openai.responses",
            {"input": "Hi", "tools": [{"type": [], "name": "f"}]},
            "tools[0].type",
        ),
    ],
)
def test_a_type_that_is_not_a_string_is_refused_naming_it(
    name: str, body: dict[str, Any], field: str
) -> None:
    """A block's or tool's `type` read before its struct (a list is unhashable: once a 500)."""
    with pytest.raises(GenerationError) as refused:
        DECODERS[name][0](json.dumps(body).encode())
    assert (refused.value.field or "").removeprefix("$.") == field
