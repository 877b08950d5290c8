"""The output-constraint vocabulary and each protocol's form of it, without a server."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from protocols.constraints import (
    ANY_OBJECT,
    Constraint,
    ResponseFormat,
    UncompilableConstraint,
    constrained,
    guided,
    is_constrained,
    only_one,
    placed,
    response_format,
    structured_outputs,
    tgi_grammar,
)
from protocols.errors import ErrorKind, GenerationError
from protocols.generation import SamplingOptions
from protocols.lmi_requests import InvalidPayload, decode_lmi
from protocols.openai_requests import decode_chat, decode_completion
from protocols.tgi import decode_tgi

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TEXT = json.dumps(SCHEMA)
OPTIONS = SamplingOptions()


def refusal(call: Any, *args: Any, **kwargs: Any) -> GenerationError:
    with pytest.raises(GenerationError) as caught:
        call(*args, **kwargs)
    return caught.value


def test_tgi_grammar_forms() -> None:
    field = "$.parameters.grammar"
    for kind in ("json", "json_object"):
        for value in (SCHEMA, TEXT):
            got = tgi_grammar({"type": kind, "value": value}, field)
            assert got == Constraint("json", json.dumps(SCHEMA, separators=(",", ":")), field)
    named = tgi_grammar({"type": "json_schema", "value": {"name": "n", "schema": SCHEMA}}, field)
    assert named.kind == "json" and json.loads(str(named.value)) == SCHEMA
    assert tgi_grammar({"type": "regex", "value": "[0-9]+"}, field) == Constraint(
        "regex", "[0-9]+", field
    )
    refusals: list[tuple[Any, str]] = [
        ({"type": "xml", "value": "a"}, f"{field}.type"),
        ({"type": "regex", "value": 3}, f"{field}.value"),
        ({"type": "json", "value": "{not json"}, f"{field}.value"),
        ({"type": "json", "value": [1]}, f"{field}.value"),
        ({"type": "json_schema", "value": {"name": "n"}}, f"{field}.value"),
        ({"value": "a"}, field),
        ("regex", field),
    ]
    for grammar, where in refusals:
        error = refusal(tgi_grammar, grammar, field)
        assert error.kind == ErrorKind.INVALID_REQUEST
        assert error.field is not None and error.field.startswith(where), (grammar, error)


def test_response_format_openai_and_tgi_forms() -> None:
    def fmt(**doc: Any) -> Constraint | None:
        return response_format(msgspec.convert(doc, ResponseFormat))

    assert fmt(type="text") is None
    assert fmt(type="json_object") == Constraint("json", ANY_OBJECT, "response_format")
    openai = fmt(type="json_schema", json_schema={"name": "x", "schema": SCHEMA})
    assert openai is not None and json.loads(str(openai.value)) == SCHEMA
    assert openai.field == "response_format.json_schema.schema"
    tgi = fmt(type="json_object", value=SCHEMA)
    assert tgi is not None and json.loads(str(tgi.value)) == SCHEMA
    assert fmt(type="regex", value="a|b") == Constraint("regex", "a|b", "response_format")
    assert refusal(fmt, type="json_schema").field == "response_format.json_schema"
    assert refusal(fmt, type="regex").field == "response_format.value"


def test_structured_outputs_and_guided() -> None:
    field = "$.parameters.structured_outputs"
    assert structured_outputs({"json": SCHEMA}, field).field == f"{field}.json"
    assert structured_outputs({"regex": "a+"}, field) == Constraint("regex", "a+", f"{field}.regex")
    assert structured_outputs({"choice": ["x", "y"]}, field).value == ("x", "y")
    assert structured_outputs({"grammar": 'root ::= "a"'}, field).kind == "grammar"
    assert structured_outputs({"json_object": True}, field).value == ANY_OBJECT
    bads: list[dict[str, Any]] = [{}, {"regex": "a", "choice": ["b"]}, {"choice": []}]
    for bad in [*bads, {"json_object": False}]:
        error = refusal(structured_outputs, bad, field)
        assert error.field is not None and error.field.startswith(field), bad
    assert refusal(structured_outputs, {"backend": "x"}, field).field == f"{field}.backend"
    assert guided("$.parameters") is None
    assert guided("$.parameters", regex="a").field == "$.parameters.guided_regex"  # type: ignore[union-attr]
    two = refusal(guided, "$.parameters", regex="a", choice=["b"])
    assert two.field == "$.parameters.guided_choice" and "guided_regex" in two.message


def test_the_neutral_options_hold_one_constraint() -> None:
    options = SamplingOptions()
    assert not is_constrained(options) and constrained(options, None) is options
    for kind, value, name in (
        ("json", TEXT, "json_schema"),
        ("regex", "a", "regex"),
        ("grammar", 'root ::= "a"', "grammar"),
        ("choice", ("a", "b"), "choice"),
    ):
        held = constrained(options, Constraint(kind, value, "f"))  # type: ignore[arg-type]
        assert getattr(held, name) == value and is_constrained(held)
    a, b = Constraint("regex", "a", "one"), Constraint("regex", "b", "two")
    assert only_one(None, a) is a
    assert refusal(only_one, a, b).field == "two"


def test_an_uncompilable_constraint_is_placed_at_its_field() -> None:
    error = UncompilableConstraint(ErrorKind.UNPROCESSABLE, "The engine refused the request: x")
    at = placed(error, "$.parameters.grammar")
    assert at.field == "$.parameters.grammar" and at.message.endswith("`$.parameters.grammar`")
    other = GenerationError(ErrorKind.UNPROCESSABLE, "no")
    assert placed(other, "f") is other and placed(error, None) is error


def test_each_protocol_names_its_constraint_field() -> None:
    grammar = {"type": "regex", "value": "[a-z]+"}
    body = json.dumps({"inputs": "hi", "parameters": {"grammar": grammar}})
    call = decode_tgi(body, stream=False, full_text_default=False, max_new_tokens=5)
    assert (call.options.regex, call.constraint_field) == ("[a-z]+", "$.parameters.grammar")

    chat = {"messages": [{"role": "user", "content": "hi"}]}
    tgi_chat = {**chat, "response_format": {"type": "json_object", "value": SCHEMA}}
    [request] = decode_chat(json.dumps(tgi_chat).encode(), 100).requests
    assert request.options.json_schema is not None and request.constraint_field == "response_format"
    vllm_chat = {**chat, "structured_outputs": {"choice": ["yes", "no"]}}
    [request] = decode_chat(json.dumps(vllm_chat).encode(), 100).requests
    assert request.options.choice == ("yes", "no")
    assert request.constraint_field == "structured_outputs.choice"
    both = {**tgi_chat, "structured_outputs": {"regex": "a"}}
    assert refusal(decode_chat, json.dumps(both).encode(), 100).field == "structured_outputs.regex"
    completion = {"prompt": ["a", "b"], "structured_outputs": {"regex": "x"}}
    requests = decode_completion(json.dumps(completion).encode(), 100).requests
    assert all(r.constraint_field == "structured_outputs.regex" for r in requests)

    def lmi(parameters: dict[str, Any], tgi_compat: bool = False) -> Any:
        raw = json.dumps({"inputs": "hi", "parameters": parameters})
        return decode_lmi(raw, formatter="", tgi_compat=tgi_compat, max_new_tokens=5)

    assert lmi({"structured_outputs": {"json": SCHEMA}}).options.json_schema is not None
    assert lmi({"guided_regex": "a+"}).constraint_field == "$.parameters.guided_regex"
    assert lmi({"guided_json": TEXT}).options.json_schema is not None
    assert lmi({"grammar": grammar}, tgi_compat=True).options.regex == "[a-z]+"
    for parameters, where in (
        ({"grammar": grammar}, "$.parameters.grammar"),  # TGI's, only under OPTION_TGI_COMPAT
        ({"guided_regex": "a", "structured_outputs": {"regex": "b"}}, "guided_regex"),
        ({"guided_choice": ["a"], "num_beams": 2}, "num_beams"),
        ({"structured_outputs": {"regex": 1}}, "$.parameters.structured_outputs.regex"),
    ):
        with pytest.raises(InvalidPayload) as caught:
            lmi(parameters)
        assert where in caught.value.error.message, (parameters, caught.value.error)


def test_protocols_whose_spec_has_no_constraint_refuse_one_naming_it() -> None:
    from protocols.batch_payload import decode_batch
    from protocols.control import decode_client
    from protocols.ws_events import decode_starts

    regex = {"regex": "[a-z]+"}
    prompts = [{"request_id": "a", "prompt": "p"}]
    batch = decode_batch(json.dumps({"prompts": prompts, "generation_config": regex}), OPTIONS)
    assert [r.error.field for r in batch.rejected] == ["$.generation_config.regex"]
    start = {"type": "START", "id": "a", "data": "p", "parameters": {"json_schema": SCHEMA}}
    _, refused = decode_starts(json.dumps([start]), OPTIONS)
    assert [r.error.field for r in refused] == ["$[0].parameters.json_schema"]
    config = {"type": "config", "prompt": "p", "parameters": {"grammar": "root ::= x"}}
    assert refusal(decode_client, json.dumps(config)).field == "$.parameters.grammar"
