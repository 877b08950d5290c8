"""Tool calls with vLLM's own pieces: generation held to the choice's grammar
(tool_grammars.py: vLLM's schema for `required` and a named function, vLLM's structural tag
for `auto` with a parser, the gateway's own format without one), and vLLM's parsers reading
each choice's output (`vllm.parser`'s `DelegatingParser`, whole or step by step): for
`required`, a named function and the gateway's own format its JSON reading of the calls, for
`auto` the tool parser TOOL_CALL_PARSER names (hermes, llama3_json, mistral, ...; the default
model's: hermes).

`ToolParsing` is the configuration, checked at start-up; `ToolCalling` one chat request's
calls (protocols/tool_calls.py's `ToolAnswers`), one parser state per choice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import msgspec
from pydantic import ValidationError
from vllm.entrypoints.generate.base.protocol import DeltaMessage, FunctionCall
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.exceptions import VLLMValidationError
from vllm.parser import Parser, ParserManager
from vllm.parser.abstract_parser import DelegatingParser
from vllm.renderers.chat_utils import make_tool_call_id
from vllm.tool_parsers import ToolParser

from gateway.config.settings import ConfigError, Settings, constraint_budget
from gateway.engine.tool_grammars import (
    auto_grammar,
    calls_grammar,
    compact_grammar,
)
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
# The parser the gateway reads the embedded default model's calls with: the template it ships
# for it (gateway/engine/chat_template.py) writes them hermes-style.
DEFAULT_MODEL_PARSER = "hermes"
# What the gateway's own format tells a model with no tool parser (TGI's `tool_prompt` replaces
# it), before the tools themselves.
OWN_TOOL_PROMPT = (
    "You may call these tools: to call them, answer with nothing but a JSON array of calls, "
    '[{"name": <function-name>, "parameters": <arguments-object>}]; else answer in plain text.'
)


class _JsonCalls(DelegatingParser):
    """vLLM's reading of `required` and named-function output (a JSON array of `{name,
    parameters}`, or the arguments alone), which needs no model-specific tool parser: the
    base `ToolParser` answers `supports_required_and_named`."""

    tool_parser_cls = ToolParser


@dataclass(frozen=True)
class ToolParsing:
    """ENABLE_AUTO_TOOL_CHOICE and TOOL_CALL_PARSER: `auto` is the parser class for
    `tool_choice: auto` (None: the gateway's own format), `enabled` whether `auto` is served."""

    auto: type[Parser] | None = None
    parser_name: str = ""
    budget: ConstraintBudget = _DEFAULT_BUDGET
    enabled: bool = True

    @classmethod
    def configured(cls, settings: Settings) -> ToolParsing:
        name = settings.tool_call_parser
        if not name and not settings.engine.model and not settings.chat_template:
            name = DEFAULT_MODEL_PARSER  # the default model's template is the gateway's
        budget = constraint_budget(settings)
        enabled = settings.enable_auto_tool_choice
        if not name:
            return cls(None, name, budget, enabled)
        try:
            parser = ParserManager.get_parser(tool_parser_name=name, enable_auto_tools=True)
        except TypeError as e:
            raise ConfigError(f"TOOL_CALL_PARSER={name}: {e}") from e
        return cls(parser, name, budget, enabled)

    def calling(self, use: ToolUse, engine: Any) -> ToolCalling:
        """One request's calls, on `engine`'s tokenizer; its refusals name the field. The
        tools' schemas are held to the size limits on constraints first: every choice but
        `none` compiles them into a grammar here and in the engine."""
        check_tools(use.tools, self.budget)
        if use.choice == "auto" and not self.enabled:
            raise invalid(
                '"auto" tool choice is turned off on this server (ENABLE_AUTO_TOOL_CHOICE=false, '
                'LMI: OPTION_ENABLE_AUTO_TOOL_CHOICE); `tool_choice` "required", a named '
                'function or "none" are served',
                "tool_choice",
            )
        if use.forced:
            return ToolCalling(use, engine, _JsonCalls, None)
        if use.choice == "auto":
            return ToolCalling(use, engine, self.auto, self._tag_model())
        return ToolCalling(use, engine, None, None)

    def _tag_model(self) -> str | None:
        """The configured parser's structural tag (tool_grammars.py), None when it has none."""
        tool_parser = getattr(self.auto, "tool_parser_cls", None)
        model = getattr(tool_parser, "structural_tag_model", None)
        return model if isinstance(model, str) else None


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
    choice read for calls, whole (`message`) or a streamed step at a time (`delta`).

    `parser` reads the calls (None: for `auto`, the gateway's own format; for `none`,
    nothing); `tag_model` is its structural tag, None when it has none."""

    def __init__(
        self, use: ToolUse, engine: Any, parser: type[Parser] | None, tag_model: str | None
    ) -> None:
        self.use = use
        self._engine = engine
        self._own = use.choice == "auto" and parser is None
        # the gateway's own format writes `required`'s calls: read as vLLM reads those
        self._parser = _JsonCalls if self._own else parser
        self._tag_model = tag_model
        self._request = _vllm_request(use)
        self._read_as = (
            self._request.model_copy(update={"tool_choice": "required"})
            if self._own
            else self._request
        )
        self._streams: dict[int, Parser] = {}
        self._plain: set[int] = set()  # the gateway's own format: choices answering text
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
        """Generation held to the calls' grammar (tool_grammars.py): `required` and a named
        function over any `response_format`, as vLLM does; `auto` unless the request holds its
        answer to a constraint of its own. Special tokens are kept in the text where the
        parser asks for them (a model's `<tool_call>` may be one); the gateway's own format
        shows the model the tools and how to call them."""
        if self._parser is None:
            return requests
        grammar = self._grammar()
        if self._own:
            requests = [_told(r, self.use) for r in requests]
        held = [
            msgspec.structs.replace(
                r,
                options=msgspec.structs.replace(
                    r.options, grammar=grammar, json_schema=None, regex=None, choice=None
                ),
                constraint_field=TOOLS_FIELD,
            )
            if grammar is not None and (self.use.forced or not _constrained(r))
            else r
            for r in requests
        ]
        if self.use.forced or self._own:
            return held
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
            for r in held
        ]

    def _grammar(self) -> str | None:
        """The choice's grammar (None: `auto` with a parser that has no structural tag, as
        free as vLLM's server leaves it). A schema xgrammar cannot compile is refused naming
        the tool."""
        request = self._request
        try:
            if self.use.forced:
                return calls_grammar(request)
            if self._tag_model is None and not self._own:
                return None
            return auto_grammar(self._tag_model, json.dumps(self.use.tools), self.use.parallel)
        except VLLMValidationError as e:
            raise invalid(f"The tools' schemas cannot be combined: {e}", "tools") from e
        except (RuntimeError, ValueError, TypeError):
            raise self._culprit() from None

    def _culprit(self) -> Exception:
        """The refusal naming the tool whose `parameters` the engine cannot hold output to."""
        for i, tool in enumerate(self.use.tools):
            function = tool["function"]
            if self.use.choice == "function" and function["name"] != self.use.function:
                continue
            try:
                compact_grammar(json.dumps(function.get("parameters") or {"type": "object"}))
            except (RuntimeError, ValueError, TypeError) as e:
                return invalid(
                    f"The engine cannot hold output to this schema: {e}",
                    f"tools[{i}].function.parameters",
                )
        return invalid("The engine cannot hold output to the tools' schemas", "tools")

    def message(self, index: int, text: str, finish_reason: str) -> ParsedMessage:
        parser = self._make()
        if parser is None or (self._own and not text.startswith("[")):
            return ParsedMessage(text, [], finish_reason)
        if finish_reason == "length":  # read as streamed: a cut call comes as far as it got
            step = parser.parse_delta(text, [], self._read_as, prompt_token_ids=[], finished=False)
            calls = _whole(step)
            content = step.content if step is not None and step.content else None
        else:
            auto = self.use.choice == "auto" and not self._own
            _, content, found = parser.parse(text, self._read_as, enable_auto_tools=auto)
            calls = [_call(c) for c in found or []]
        if not self.use.parallel:
            calls = calls[:1]
        if self.use.forced or self._own:
            content = None
        return ParsedMessage(content, calls, self._reason(finish_reason, bool(calls)))

    def delta(
        self, index: int, text: str, token_ids: list[int], finish_reason: str | None
    ) -> ParsedDelta:
        if index in self._plain:
            return ParsedDelta(text or None, None, finish_reason)
        parser = self._streams.get(index)
        if parser is None:
            if self._own and not text:  # the first character decides: a call, or text
                return ParsedDelta(None, None, finish_reason)
            if self._own and not text.startswith("["):
                self._plain.add(index)
                return ParsedDelta(text, None, finish_reason)
            parser = self._make()
            if parser is None:
                return ParsedDelta(text, None, finish_reason)
            self._streams[index] = parser
        message = parser.parse_delta(
            text, token_ids, self._read_as, prompt_token_ids=[], finished=finish_reason is not None
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


def _constrained(request: GenerationRequest) -> bool:
    o = request.options
    return any(c is not None for c in (o.grammar, o.json_schema, o.regex, o.choice))


def _told(request: GenerationRequest, use: ToolUse) -> GenerationRequest:
    """`request` with the tools and how to call them after its last message (as TGI appended
    its `tool_prompt`), for a model the gateway reads in its own format."""
    if not request.messages:
        return request
    tools = "\n".join(json.dumps(t["function"]) for t in use.tools)
    note = f"\n---\n{use.prompt or OWN_TOOL_PROMPT}\n{tools}"
    *before, last = request.messages
    told = {**last, "content": f"{last.get('content') or ''}{note}"}
    return msgspec.structs.replace(request, messages=(*before, told))


def _whole(message: DeltaMessage | None) -> list[ToolCall]:
    """The calls one streamed step carries, put together (a call's pieces share its index)."""
    calls: dict[int, tuple[str, str, str]] = {}
    for piece in message.tool_calls if message is not None else []:
        function = piece.function
        id_, name, arguments = calls.get(piece.index, ("", "", ""))
        if function is not None:
            name = name or function.name or ""
            arguments += function.arguments or ""
        calls[piece.index] = (id_ or piece.id or "", name, arguments)
    return [
        ToolCall(id=id_ or make_tool_call_id(), function=CalledFunction(name, arguments))
        for id_, name, arguments in (calls[i] for i in sorted(calls))
        if name
    ]


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
