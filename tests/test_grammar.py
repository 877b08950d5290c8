"""Output constraints on the real engine (issue 32): TGI's `grammar` with huggingface_hub's
InferenceClient, TGI's `response_format` on the chat route, vLLM's `structured_outputs` and
LMI's `guided_*` on `/invocations`; a constraint the engine cannot compile is each route's 4xx
naming the field."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import httpx
import jsonschema  # type: ignore[import-untyped]
import openai
import pytest
from huggingface_hub import InferenceClient, TextGenerationInputGrammarType
from huggingface_hub.errors import ValidationError

from clients import CHAT, web
from protocols.constraints import UncompilableConstraint
from protocols.generation import SamplingOptions
from serving import LoopThread, RunningServer

if TYPE_CHECKING:
    from gateway.engine.vllm_engine import VllmEngine

MODEL = "SmolLM2-135M-Instruct"
PATTERNS = [
    r"(yes|no)",
    r"[0-9]{3}-[0-9]{4}",
    r"[A-Z][a-z]{2,9}",
    r"(red|green|blue) (cat|dog|bird)",
    r"[a-z]{2,8}@[a-z]{2,8}\.(com|org)",  # bounded: every answer ends within max_new_tokens
]
TOPICS = [
    "Is the sky blue?",
    "Give me a phone number.",
    "Name a city.",
    "Describe a pet.",
    "Write an email address.",
    "Do fish swim?",
    "What is your favourite number?",
    "Name a country in Europe.",
    "What colour is grass?",
    "Who wrote Hamlet?",
]
PROMPTS = [CHAT.format(t) for t in TOPICS + [t.upper() for t in TOPICS]]  # 20 prompts
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "colour": {"enum": ["red", "green", "blue"]},
        "pet": {"type": "boolean"},
    },
    "required": ["name", "colour", "pet"],
    "additionalProperties": False,
}
BAD_REGEX = "(unclosed"
BAD_SCHEMA = {"type": "no-such-type"}


def typed(grammar: dict[str, Any]) -> TextGenerationInputGrammarType:
    """A grammar as huggingface_hub's own type (TGI's `GrammarType`)."""
    return TextGenerationInputGrammarType(type=grammar["type"], value=grammar["value"])


def hub(server: RunningServer) -> InferenceClient:
    return InferenceClient(base_url=server.http)


def post(server: RunningServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return web.post(server.http + path, json=body)


def _text(pieces: list[Any]) -> str:
    """A TGI stream's text: its tokens but the special ones (the end of sequence)."""
    return "".join(p.token.text for p in pieces if not p.token.special)


# `make test-all` only (issue 55: `make test`'s time on the slowest CPU); a JSON grammar's
# streamed and whole answers stay in `make test`.
@pytest.mark.long
def test_a_regex_grammar_is_matched_whole_on_twenty_prompts(server: RunningServer) -> None:
    tgi = hub(server)
    for i, prompt in enumerate(PROMPTS):
        pattern = PATTERNS[i % len(PATTERNS)]
        text = tgi.text_generation(
            prompt,
            max_new_tokens=32,
            do_sample=True,
            temperature=0.8,
            seed=i,
            return_full_text=False,
            grammar=typed({"type": "regex", "value": pattern}),
        )
        assert re.fullmatch(pattern, text), (pattern, text)


def test_a_json_grammar_validates_streamed_and_not(server: RunningServer) -> None:
    tgi = hub(server)
    prompt = CHAT.format("Describe a person as JSON: name, favourite colour, has a pet.")
    for value in (PERSON, json.dumps(PERSON)):  # TGI takes the schema or its JSON text
        grammar = typed({"type": "json", "value": value})
        text = tgi.text_generation(
            prompt, max_new_tokens=120, return_full_text=False, grammar=grammar
        )
        jsonschema.validate(json.loads(text), PERSON)
    streamed = tgi.text_generation(
        prompt,
        max_new_tokens=120,
        stream=True,
        details=True,
        grammar=typed({"type": "json_object", "value": PERSON}),
    )
    pieces = list(streamed)
    assert pieces[-1].details is not None and pieces[-1].details.finish_reason == "eos_token"
    jsonschema.validate(json.loads(_text(pieces)), PERSON)
    regex = tgi.text_generation(
        prompt,
        max_new_tokens=32,
        stream=True,
        details=True,
        grammar=typed({"type": "regex", "value": PATTERNS[3]}),
    )
    assert re.fullmatch(PATTERNS[3], _text(list(regex)))
    answer = post(
        server,
        "/generate",
        {
            "inputs": prompt,
            "parameters": {
                "max_new_tokens": 120,
                "grammar": {"type": "json_schema", "value": {"name": "person", "schema": PERSON}},
            },
        },
    )
    jsonschema.validate(json.loads(answer.json()["generated_text"]), PERSON)


def test_tgi_response_format_on_the_chat_route(server: RunningServer) -> None:
    messages = [{"role": "user", "content": "Describe a person as JSON."}]
    for fmt in (
        {"type": "json_object", "value": PERSON},
        {"type": "json", "value": json.dumps(PERSON)},
    ):
        answer = hub(server).chat_completion(
            messages,
            max_tokens=120,
            temperature=0,
            response_format=cast(Any, fmt),  # TGI's form, beside the typed OpenAI one
        )
        jsonschema.validate(json.loads(answer.choices[0].message.content or ""), PERSON)
    regex = post(
        server,
        "/v1/chat/completions",
        {
            "messages": messages,
            "max_tokens": 32,
            "response_format": {"type": "regex", "value": PATTERNS[1]},
        },
    )
    assert re.fullmatch(PATTERNS[1], regex.json()["choices"][0]["message"]["content"])
    vllm_form = openai.OpenAI(base_url=server.http + "/v1", api_key="unused").completions.create(
        model=MODEL,
        prompt=CHAT.format("Is water wet?"),
        max_tokens=8,
        extra_body={"structured_outputs": {"choice": ["yes", "no", "maybe"]}},
    )
    assert vllm_form.choices[0].text in {"yes", "no", "maybe"}


def test_lmi_structured_outputs_and_guided_parameters(
    server: RunningServer, make_server: Callable[..., RunningServer]
) -> None:
    prompt = CHAT.format("Describe a person as JSON.")
    for parameters in (
        {"structured_outputs": {"json": PERSON}},
        {"guided_json": PERSON},
    ):
        answer = post(
            server,
            "/invocations",
            {"inputs": prompt, "parameters": {"max_new_tokens": 120, **parameters}},
        )
        assert answer.status_code == 200, answer.text
        jsonschema.validate(json.loads(answer.json()["generated_text"]), PERSON)
    streamed = post(
        server,
        "/invocations",
        {
            "inputs": [prompt, CHAT.format("A phone number?")],
            "parameters": {"max_new_tokens": 32, "guided_regex": PATTERNS[1]},
        },
    )
    assert all(re.fullmatch(PATTERNS[1], a["generated_text"]) for a in streamed.json())
    compat = make_server(OPTION_TGI_COMPAT="true")
    answer = post(
        compat,
        "/invocations",
        {
            "inputs": prompt,
            "parameters": {
                "max_new_tokens": 32,
                "grammar": {"type": "regex", "value": PATTERNS[0]},
            },
        },
    )
    assert re.fullmatch(PATTERNS[0], answer.json()[0]["generated_text"]), answer.text


def _tgi_refusal(call: Callable[[], object], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        call()
    assert f"`{field}`" in str(caught.value), caught.value


@pytest.mark.parametrize(
    "grammar",
    [
        {"type": "regex", "value": BAD_REGEX},
        {"type": "json", "value": BAD_SCHEMA},
    ],
)
def test_an_uncompilable_constraint_is_each_routes_refusal_naming_its_field(
    server: RunningServer, make_server: Callable[..., RunningServer], grammar: dict[str, Any]
) -> None:
    tgi = hub(server)
    field = "$.parameters.grammar"
    _tgi_refusal(lambda: tgi.text_generation("Hi", max_new_tokens=4, grammar=typed(grammar)), field)
    _tgi_refusal(
        lambda: list(
            tgi.text_generation("Hi", max_new_tokens=4, grammar=typed(grammar), stream=True)
        ),
        field,
    )
    for path in ("/generate", "/"):
        refused = post(server, path, {"inputs": "Hi", "parameters": {"grammar": grammar}})
        assert refused.status_code == 422, refused.text
        assert refused.json()["error_type"] == "validation" and field in refused.json()["error"]
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    refused = post(server, "/v1/chat/completions", {**chat, "response_format": grammar})
    assert refused.status_code == 422
    assert refused.json()["error"]["param"] == "response_format", refused.text
    structured = {"regex": BAD_REGEX} if grammar["type"] == "regex" else {"json": BAD_SCHEMA}
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        openai.OpenAI(base_url=server.http + "/v1", api_key="unused").completions.create(
            model=MODEL, prompt="Hi", max_tokens=4, extra_body={"structured_outputs": structured}
        )
    assert caught.value.body["param"] == f"structured_outputs.{grammar['type']}"  # type: ignore[index]
    lmi_field = f"$.parameters.structured_outputs.{grammar['type']}"
    lmi = {"inputs": "Hi", "parameters": {"max_new_tokens": 4, "structured_outputs": structured}}
    refused = post(server, "/invocations", lmi)
    assert refused.status_code == 424 and lmi_field in refused.text, refused.text
    refused = post(server, "/invocations", {**lmi, "stream": True})
    assert refused.status_code == 424 and lmi_field in refused.text, refused.text
    compat = make_server(OPTION_TGI_COMPAT="true")
    tgi_lmi = {"inputs": "Hi", "parameters": {"max_new_tokens": 4, "grammar": grammar}}
    refused = post(compat, "/invocations", tgi_lmi)
    assert refused.status_code == 424 and field in refused.text, refused.text
    assert tgi.text_generation("Hi", max_new_tokens=2)  # the server still answers


def test_a_constraint_is_checked_before_the_request_reaches_the_engine(
    loop_thread: LoopThread, engine: VllmEngine
) -> None:
    """The compile in the worker, then vLLM's own check, asked about the constraint alone
    (gateway/engine/constraint_check.py), refuse what the engine's grammar backend cannot
    compile and leave the request's parameters as they were."""
    from gateway.engine.sampling import sampling_params

    check_constraint = engine.constraints.check

    uncompilable = [
        SamplingOptions(regex=BAD_REGEX),
        SamplingOptions(json_schema=json.dumps(BAD_SCHEMA)),
        SamplingOptions(grammar='root ::= "unclosed'),
    ]
    for options in uncompilable:
        with pytest.raises(UncompilableConstraint) as caught:
            loop_thread.run(check_constraint(sampling_params(options)))
        assert caught.value.message.startswith("The engine ")
    params = sampling_params(SamplingOptions(choice=("yes", "no")))
    loop_thread.run(check_constraint(params))
    assert params.structured_outputs is not None
    assert (params.structured_outputs.choice, params.structured_outputs.grammar) == (
        ["yes", "no"],
        None,
    )
    loop_thread.run(check_constraint(sampling_params(SamplingOptions())))
