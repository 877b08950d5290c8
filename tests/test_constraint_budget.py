"""The budget for output constraints (issue 43): the size limits before the engine
(protocols/constraint_budget.py), and the compile within a time and memory budget in a worker
process that is killed past it (gateway/engine/constraint_check.py), on the real engine with a
hostile probe's own shapes. A compile past its deadline or its memory, and the workers' fair
sharing: tests/test_compile_faults.py."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import psutil
import pytest
from huggingface_hub import InferenceClient

from clients import web
from protocols.constraint_budget import (
    TOOLS_FIELD,
    ConstraintBudget,
    check_options,
    check_tools,
)
from protocols.constraints import UncompilableConstraint
from protocols.errors import GenerationError
from protocols.generation import SamplingOptions
from serving import LoopThread, RunningServer

if TYPE_CHECKING:
    from gateway.engine.vllm_engine import VllmEngine

MODEL = "SmolLM2-135M-Instruct"
BUDGET = ConstraintBudget()


def words_regex(count: int, tag: str = "p") -> str:
    """The probe's regex: alternated words."""
    return "|".join(f"w{tag}x{i}" for i in range(count))


def properties_schema(count: int) -> dict[str, Any]:
    """The probe's schema: string properties, none required (the costly kind to compile)."""
    return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(count)}}


def enum_schema(count: int) -> dict[str, Any]:
    return {"type": "string", "enum": [f"value{i}" for i in range(count)]}


PROBES = [
    ("regex", words_regex(50_000), "MAX_REGEX_CHARS"),
    ("json", properties_schema(10_000), "MAX_SCHEMA_BYTES"),
    ("json", enum_schema(100_000), "MAX_SCHEMA_BYTES"),
]


def refusal(options: SamplingOptions, field: str = "$.f") -> GenerationError:
    with pytest.raises(GenerationError) as caught:
        check_options(options, field, BUDGET)
    assert caught.value.field == field
    return caught.value


def test_each_limit_is_named_with_the_field() -> None:
    cases = [
        (SamplingOptions(regex="a" * (64 * 1024 + 1)), "MAX_REGEX_CHARS"),
        (SamplingOptions(grammar="a" * (64 * 1024 + 1)), "MAX_GRAMMAR_CHARS"),
        (SamplingOptions(json_schema=json.dumps(properties_schema(501))), "MAX_SCHEMA_PROPERTIES"),
        (SamplingOptions(json_schema=json.dumps(enum_schema(5001))), "MAX_SCHEMA_ENUM_VALUES"),
        (SamplingOptions(choice=tuple(str(i) for i in range(1025))), "MAX_CHOICES"),
        (SamplingOptions(choice=("a" * 40_000, "b" * 40_000)), "MAX_CHOICE_CHARS"),
    ]
    for options, setting in cases:
        error = refusal(options)
        assert setting in error.message and error.message.endswith("- at `$.f`"), error.message
    nested: dict[str, Any] = {"type": "string"}
    for _ in range(40):
        nested = {"type": "array", "items": nested}
    assert "MAX_SCHEMA_DEPTH" in refusal(SamplingOptions(json_schema=json.dumps(nested))).message
    # Properties and enum values count over the whole schema, however they are spread.
    spread = {"anyOf": [properties_schema(300), properties_schema(300)]}
    assert (
        "MAX_SCHEMA_PROPERTIES" in refusal(SamplingOptions(json_schema=json.dumps(spread))).message
    )


def test_legitimate_constraints_are_within_the_budget() -> None:
    within = [
        SamplingOptions(regex=words_regex(7000)),
        SamplingOptions(json_schema=json.dumps(properties_schema(500))),
        SamplingOptions(json_schema=json.dumps(enum_schema(5000))),
        SamplingOptions(choice=tuple(f"choice {i}" for i in range(1024))),
        SamplingOptions(grammar='root ::= "yes" | "no"'),
    ]
    for options in within:
        check_options(options, "$.f", BUDGET)


def test_tools_schemas_are_held_to_the_budget() -> None:
    def tool(schema: dict[str, Any]) -> dict[str, Any]:
        return {"type": "function", "function": {"name": "f", "parameters": schema}}

    check_tools([tool(properties_schema(200)), tool(enum_schema(100))], BUDGET)
    with pytest.raises(GenerationError) as caught:
        check_tools([tool(properties_schema(10)), tool(properties_schema(501))], BUDGET)
    assert caught.value.field == "tools[1].function.parameters"
    with pytest.raises(GenerationError) as caught:  # together past it: the tools as one
        check_tools([tool(properties_schema(300)), tool(properties_schema(300))], BUDGET)
    assert caught.value.field == "tools" and "MAX_SCHEMA_PROPERTIES" in caught.value.message
    # The grammar built from them is larger than a grammar given may be: not held to that.
    check_options(SamplingOptions(grammar="a" * (128 * 1024)), TOOLS_FIELD, BUDGET)


def _core_rss(engine: VllmEngine) -> int:
    from gateway.engine.vllm_seam import core_processes

    return sum(psutil.Process(p.pid).memory_info().rss for p in core_processes(engine.llm))


def test_the_probes_shapes_are_refused_before_the_engine_on_every_protocol(
    server: RunningServer, engine: VllmEngine
) -> None:
    """The 50,000-word regex, the 10,000-property schema and the 100,000-value enum: each a
    4xx naming the field and the limit, the engine not rebuilt, its compiles untouched, its
    memory where it was, and /health answering throughout."""
    holder = server.gateway.service.holder
    restarts, compiles = holder.restarts, engine.constraints.compiles
    rss = _core_rss(engine)
    with web.client(base_url=server.http) as http:
        for kind, value, setting in PROBES:
            chat = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 2,
                "structured_outputs": {kind: value},
            }
            answer = http.post("/v1/chat/completions", json=chat)
            assert answer.status_code == 400, answer.text
            error = answer.json()["error"]
            assert error["param"] == f"structured_outputs.{kind}", error
            assert setting in error["message"], error
            grammar = {"type": kind, "value": value}
            tgi = http.post("/generate", json={"inputs": "Hi", "parameters": {"grammar": grammar}})
            assert tgi.status_code == 422 and setting in tgi.json()["error"], tgi.text
            assert "parameters.grammar" in tgi.json()["error"], tgi.text
            assert http.get("/health").status_code == 200
        # The Responses API's text.format, and a tool's parameters, are schemas too.
        schema = properties_schema(10_000)
        fmt = {"type": "json_schema", "name": "probe", "schema": schema}
        body = {"model": MODEL, "input": "Hi", "max_output_tokens": 2, "text": {"format": fmt}}
        answer = http.post("/v1/responses", json=body)
        assert answer.status_code == 400 and "MAX_SCHEMA_BYTES" in answer.text, answer.text
        tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
        chat = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 2,
            "tools": tools,
            "tool_choice": "required",
        }
        answer = http.post("/v1/chat/completions", json=chat)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == "tools[0].function.parameters", answer.text
    assert (holder.restarts, engine.constraints.compiles) == (restarts, compiles)
    assert holder.engine is engine
    assert _core_rss(engine) < rss + 64 * 1024 * 1024
    assert InferenceClient(server.http).text_generation("Hi", max_new_tokens=2)


def test_a_constraint_compiles_once_within_its_budget(
    loop_thread: LoopThread, engine: VllmEngine
) -> None:
    """Within the size limits: compiled once in the worker (a repeat is answered from its
    verdict, and vLLM's own check from its acceptance), then generated with; vLLM's own check
    still refuses what it refuses."""
    from gateway.engine.sampling import sampling_params

    checker = engine.constraints
    options = SamplingOptions(json_schema=json.dumps(properties_schema(120)), max_new_tokens=2)
    before, verified = checker.compiles, checker.verifications
    loop_thread.run(checker.check(sampling_params(options)))
    loop_thread.run(checker.check(sampling_params(options)))
    assert checker.compiles == before + 1
    assert checker.verifications == verified + 1  # vLLM's check too: its acceptance kept
    bad = SamplingOptions(regex="(unclosed")
    with pytest.raises(UncompilableConstraint):
        loop_thread.run(checker.check(sampling_params(bad)))
    with pytest.raises(UncompilableConstraint):  # refused again from its verdict
        loop_thread.run(checker.check(sampling_params(bad)))
    assert checker.compiles == before + 2
