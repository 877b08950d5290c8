"""Tool calls with vLLM's own pieces: the JSON schema `required` and a named function hold
generation to (vLLM's `get_json_schema_from_tools`, as its server builds it), and vLLM's
parsers reading each choice's output (`vllm.parser`'s `DelegatingParser`, whole or step by
step): for `required` and a named function its JSON reading of the constrained output, for
`auto` the tool parser TOOL_CALL_PARSER names (hermes, llama3_json, mistral, ...).

`ToolParsing` is the configuration, checked at start-up; `ToolCalling` one chat request's
calls (protocols/tool_calls.py's `ToolAnswers`), one parser state per choice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import msgspec
import xgrammar
from pydantic import ValidationError
from vllm.entrypoints.generate.base.protocol import DeltaMessage, FunctionCall
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.exceptions import VLLMValidationError
from vllm.parser import Parser, ParserManager
from vllm.parser.abstract_parser import DelegatingParser
from vllm.renderers.chat_utils import make_tool_call_id
from vllm.tool_parsers import ToolParser
from vllm.tool_parsers.utils import get_json_schema_from_tools

from gateway.config.settings import ConfigError, Settings, constraint_budget
from protocols.constraint_budget import TOOLS_FIELD, ConstraintBudget, check_tools
from protocols.errors import invalid
from protocols.generation import GenerationRequest
from protocols.tool_calls import (
    CalledFunction,
    FunctionDelta,
    ParsedDelta,
    ParsedMessage,
    ToolCall,
    ToolCallDelta,
    ToolUse,
)

_DEFAULT_BUDGET = ConstraintBudget()


class _JsonCalls(DelegatingParser):
    """vLLM's reading of `required` and named-function output (a JSON array of `{name,
    parameters}`, or the arguments alone), which needs no model-specific tool parser: the
    base `ToolParser` answers `supports_required_and_named`."""

    tool_parser_cls = ToolParser


@dataclass(frozen=True)
class ToolParsing:
    """ENABLE_AUTO_TOOL_CHOICE and TOOL_CALL_PARSER: `auto` is the parser class for
    `tool_choice: auto`, None when auto tool choice is off."""

    auto: type[Parser] | None = None
    parser_name: str = ""
    budget: ConstraintBudget = _DEFAULT_BUDGET

    @classmethod
    def configured(cls, settings: Settings) -> ToolParsing:
        name = settings.tool_call_parser
        budget = constraint_budget(settings)
        if not settings.enable_auto_tool_choice:
            return cls(None, name, budget)
        if not name:
            raise ConfigError(
                "ENABLE_AUTO_TOOL_CHOICE=true needs TOOL_CALL_PARSER (hermes, llama3_json, "
                "mistral, ...): the parser that reads the model's calls"
            )
        try:
            parser = ParserManager.get_parser(tool_parser_name=name, enable_auto_tools=True)
        except TypeError as e:
            raise ConfigError(f"TOOL_CALL_PARSER={name}: {e}") from e
        return cls(parser, name, budget)

    def calling(self, use: ToolUse, engine: Any) -> ToolCalling:
        """One request's calls, on `engine`'s tokenizer; its refusals name the field. The
        tools' schemas are held to the size limits on constraints first: `required` and a named
        function compile them into a grammar here and in the engine."""
        check_tools(use.tools, self.budget)
        if use.choice == "auto" and self.auto is None:
            raise invalid(
                '"auto" tool choice needs ENABLE_AUTO_TOOL_CHOICE=true and TOOL_CALL_PARSER '
                "(LMI: OPTION_ENABLE_AUTO_TOOL_CHOICE, OPTION_TOOL_CALL_PARSER) set on the "
                'server; `tool_choice` "required", a named function or "none" need neither',
                "tool_choice",
            )
        parser = _JsonCalls if use.forced else self.auto if use.choice == "auto" else None
        return ToolCalling(use, engine, parser)


def _vllm_request(use: ToolUse) -> ChatCompletionRequest:
    """What vLLM's parsers read the tools and the choice from."""
    choice: Any = use.choice
    if use.choice == "function":
        choice = {"type": "function", "function": {"name": use.function}}
    try:
        return ChatCompletionRequest.model_validate(
            {
                "messages": [],
                "tools": list(use.tools),
                "tool_choice": choice,
                "parallel_tool_calls": use.parallel,
            }
        )
    except (ValidationError, VLLMValidationError) as e:
        raise invalid(f"vLLM refused the tools: {e}", "tools") from e


class ToolCalling:
    """One chat request's tool calls: its generation constrained (`constrained`), and each
    choice read for calls, whole (`message`) or a streamed step at a time (`delta`)."""

    def __init__(self, use: ToolUse, engine: Any, parser: type[Parser] | None) -> None:
        self.use = use
        self._engine = engine
        self._parser = parser
        self._request = _vllm_request(use)
        self._streams: dict[int, Parser] = {}
        self._called: set[int] = set()
        self._make()  # a parser the tokenizer cannot serve fails here, not mid-stream

    def _make(self) -> Parser | None:
        if self._parser is None:
            return None
        try:
            return self._parser(self._engine.tokenizer, list(self._request.tools or []))
        except Exception as e:  # vLLM's parsers check the tokenizer as they are built
            raise invalid(
                f"The tool parser cannot read this model's output: {e}", "tool_choice"
            ) from e

    def constrained(self, requests: list[GenerationRequest]) -> list[GenerationRequest]:
        """`required` and a named function: generation held to the calls' JSON schema (over
        any `response_format`, as vLLM does); `auto`: special tokens kept in the text where
        the parser asks for them (a model's `<tool_call>` may be one)."""
        if self.use.forced:
            grammar = self._grammar()
            return [
                msgspec.structs.replace(
                    r,
                    options=msgspec.structs.replace(
                        r.options, grammar=grammar, json_schema=None, regex=None, choice=None
                    ),
                    constraint_field=TOOLS_FIELD,
                )
                for r in requests
            ]
        if self._parser is None:
            return requests
        parser = self._make()
        assert parser is not None
        adjusted = parser.adjust_request(self._request.model_copy(deep=True))
        keep = not getattr(adjusted, "skip_special_tokens", True)
        return [
            msgspec.structs.replace(
                r, options=msgspec.structs.replace(r.options, skip_special_tokens=False)
            )
            if keep
            else r
            for r in requests
        ]

    def _grammar(self) -> str:
        """vLLM's schema for the choice (its server's), as the grammar xgrammar (vLLM's
        backend) compiles from it with no free whitespace: the JSON written compact, as
        vLLM's `disable_any_whitespace` writes it, since a small model may otherwise repeat
        whitespace until max_tokens. A schema xgrammar cannot compile is refused naming the
        tool."""
        request = self._request
        try:
            schema = get_json_schema_from_tools(
                request.tool_choice or "none",
                list(request.tools or []),
                request.parallel_tool_calls,
            )
        except (ValueError, VLLMValidationError) as e:
            raise invalid(f"The tools' schemas cannot be combined: {e}", "tools") from e
        try:
            return _compact_grammar(json.dumps(schema))
        except (RuntimeError, ValueError, TypeError):
            raise self._culprit() from None

    def _culprit(self) -> Exception:
        """The refusal naming the tool whose `parameters` the engine cannot hold output to."""
        for i, tool in enumerate(self.use.tools):
            function = tool["function"]
            if self.use.choice == "function" and function["name"] != self.use.function:
                continue
            try:
                _compact_grammar(json.dumps(function.get("parameters") or {"type": "object"}))
            except (RuntimeError, ValueError, TypeError) as e:
                return invalid(
                    f"The engine cannot hold output to this schema: {e}",
                    f"tools[{i}].function.parameters",
                )
        return invalid("The engine cannot hold output to the tools' schemas", "tools")

    def message(self, index: int, text: str, finish_reason: str) -> ParsedMessage:
        parser = self._make()
        if parser is None:
            return ParsedMessage(text, [], finish_reason)
        auto = self.use.choice == "auto"
        _, content, found = parser.parse(text, self._request, enable_auto_tools=auto)
        calls = [_call(c) for c in found or []]
        if not self.use.parallel:
            calls = calls[:1]
        if self.use.forced:
            content = None
        return ParsedMessage(content, calls, self._reason(finish_reason, bool(calls)))

    def delta(
        self, index: int, text: str, token_ids: list[int], finish_reason: str | None
    ) -> ParsedDelta:
        parser = self._streams.get(index)
        if parser is None:
            parser = self._make()
            if parser is None:
                return ParsedDelta(text, None, finish_reason)
            self._streams[index] = parser
        message = parser.parse_delta(
            text, token_ids, self._request, prompt_token_ids=[], finished=finish_reason is not None
        )
        pieces = _pieces(message, self.use.parallel)
        if pieces:
            self._called.add(index)
        content = message.content if message is not None else None
        reason = (
            self._reason(finish_reason, index in self._called)
            if finish_reason is not None
            else None
        )
        return ParsedDelta(content or None, pieces or None, reason)

    def _reason(self, finish_reason: str, called: bool) -> str:
        # OpenAI's: "tool_calls" when the model called (auto) or had to (required); a named
        # function's answer ends with "stop".
        if called and self.use.choice != "function" and finish_reason == "stop":
            return "tool_calls"
        return finish_reason


@lru_cache(maxsize=256)
def _compact_grammar(schema: str) -> str:
    """xgrammar's grammar for `schema` as vLLM's xgrammar backend compiles it with
    `disable_any_whitespace` (RuntimeError, ValueError or TypeError: a schema it cannot
    compile)."""
    grammar = xgrammar.Grammar.from_json_schema(schema, any_whitespace=False, separators=(",", ":"))
    return str(grammar)


def _call(found: FunctionCall) -> ToolCall:
    return ToolCall(
        id=found.id or make_tool_call_id(),
        function=CalledFunction(found.name, found.arguments),
    )


def _pieces(message: DeltaMessage | None, parallel: bool) -> list[ToolCallDelta]:
    if message is None:
        return []
    pieces = []
    for call in message.tool_calls:
        if not parallel and call.index > 0:
            continue  # vLLM's rule: without parallel calls, only the first is answered
        function = call.function
        pieces.append(
            ToolCallDelta(
                call.index,
                call.id if call.id is not None else msgspec.UNSET,
                call.type if call.type is not None else msgspec.UNSET,
                FunctionDelta(
                    function.name if function.name is not None else msgspec.UNSET,
                    function.arguments if function.arguments is not None else msgspec.UNSET,
                )
                if function is not None
                else msgspec.UNSET,
            )
        )
    return pieces
