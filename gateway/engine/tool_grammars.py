"""The grammars tool calls are held to, as xgrammar (vLLM's structured-outputs backend) compiles
them, written as the EBNF the engine takes (`SamplingOptions.grammar`):

- `required` and a named function: vLLM's JSON schema for the choice (its server's
  `get_json_schema_from_tools`), compact, with at most `MAX_PARALLEL_CALLS` calls;
- `auto` with a tool parser that has a structural tag (vLLM's, for hermes, llama, qwen, ...):
  that tag, free text until the parser's call marker (hermes' `<tool_call>`), then calls of the
  declared tools with arguments valid against their `parameters`, at most `MAX_PARALLEL_CALLS`
  of them (one without parallel calls), then the end;
- `auto` with no tool parser: the gateway's own, a plain answer (whose first character is not
  `[`) or the calls `required` writes (a JSON array of `{"name", "parameters"}`).
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import xgrammar
from pydantic import BaseModel
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.tool_parsers.structural_tag_registry import get_model_structural_tag
from vllm.tool_parsers.tool_strict_level import ToolStrictLevel
from vllm.tool_parsers.utils import get_json_schema_from_tools
from xgrammar.structural_tag import (
    AnyTextFormat,
    ConstStringFormat,
    GrammarFormat,
    JSONSchemaFormat,
    OptionalFormat,
    OrFormat,
    RegexFormat,
    RepeatFormat,
    SequenceFormat,
    StructuralTag,
    TagFormat,
    TagsWithSeparatorFormat,
    TriggeredTagsFormat,
)

# The calls one answer may make with `parallel_tool_calls` (OpenAI's default): a small model
# asked for calls may repeat one until max_tokens; the grammar ends the answer after this many.
MAX_PARALLEL_CALLS = 8
# Whitespace in a call's arguments, in a row: what `tojson` writes (", ", ": "), no more (a
# small model given free whitespace may write it until max_tokens).
_MAX_WHITESPACE = 1
_SEPARATOR = "\n"  # between two calls, as chat templates render them


def forced_schema(request: ChatCompletionRequest) -> dict[str, Any]:
    """vLLM's schema for `required` or a named function, `required`'s array bounded (ValueError
    or vLLM's validation error: tools whose schemas cannot be combined)."""
    schema = get_json_schema_from_tools(
        request.tool_choice or "none", list(request.tools or []), request.parallel_tool_calls
    )
    if not isinstance(schema, dict):
        raise ValueError("no schema for this tool choice")
    if schema.get("type") == "array" and "maxItems" not in schema:
        schema = {**schema, "maxItems": MAX_PARALLEL_CALLS}
    return schema


@lru_cache(maxsize=256)
def compact_grammar(schema: str) -> str:
    """xgrammar's grammar for `schema` as vLLM's xgrammar backend compiles it with
    `disable_any_whitespace` (RuntimeError, ValueError or TypeError: a schema it cannot
    compile)."""
    grammar = xgrammar.Grammar.from_json_schema(schema, any_whitespace=False, separators=(",", ":"))
    return str(grammar)


def calls_grammar(request: ChatCompletionRequest) -> str:
    """`required`'s or a named function's grammar."""
    return compact_grammar(json.dumps(forced_schema(request)))


@lru_cache(maxsize=256)
def auto_grammar(tag_model: str | None, tools: str, parallel: bool) -> str:
    """`auto`'s grammar for `tools` (their JSON text), with the structural tag `tag_model` or,
    None, in the gateway's own format: built once for a set of tools (it takes milliseconds)."""
    request = ChatCompletionRequest.model_validate(
        {
            "messages": [],
            "tools": json.loads(tools),
            "tool_choice": "auto",
            "parallel_tool_calls": parallel,
        }
    )
    if tag_model is None:
        return own_auto_grammar(request)
    return parser_auto_grammar(tag_model, request)


def parser_auto_grammar(tag_model: str, request: ChatCompletionRequest) -> str:
    """`auto` held to the structural tag `tag_model` names (a parser's `structural_tag_model`):
    every call a declared tool's, its arguments valid (vLLM's PARAMETER strictness), the calls
    bounded."""
    tag = get_model_structural_tag(
        tag_model,
        request.tools,
        "auto",
        reasoning=False,
        strict_level=ToolStrictLevel.PARAMETER,
    )
    if tag is None:
        raise ValueError(f"no structural tag for {tag_model}")
    bounded = _bounded(tag.format, bool(request.parallel_tool_calls))
    return _ebnf(bounded)


def own_auto_grammar(request: ChatCompletionRequest) -> str:
    """`auto` with no tool parser: a plain answer, or `required`'s calls."""
    required = request.model_copy(update={"tool_choice": "required"})
    plain = SequenceFormat(elements=[RegexFormat(pattern=r"[^\[]"), AnyTextFormat()])
    calls = GrammarFormat(grammar=calls_grammar(required))
    return _ebnf(OrFormat(elements=[ConstStringFormat(value=""), plain, calls]))


def _ebnf(answer: Any) -> str:
    """The structural tag whose format is `answer`, as EBNF."""
    return str(xgrammar.Grammar.from_structural_tag(StructuralTag(format=answer).model_dump_json()))


def _bounded(node: Any, parallel: bool) -> Any:
    """`node` (a structural tag's format) with its lists of calls ending after the first (no
    parallel calls) or `MAX_PARALLEL_CALLS`, and its arguments' whitespace bounded."""
    if isinstance(node, JSONSchemaFormat):
        return node.model_copy(update={"max_whitespace_cnt": _MAX_WHITESPACE})
    if isinstance(node, TriggeredTagsFormat) and not node.stop_after_first:
        tags = [_bounded(t, parallel) for t in node.tags]
        if parallel and all(isinstance(t.end, str) for t in tags):
            more = _more(tags, _SEPARATOR, optional_separator=True)
            tags = [
                TagFormat(
                    begin=t.begin,
                    content=SequenceFormat(
                        elements=[t.content, ConstStringFormat(value=t.end), more]
                    ),
                    end="",
                )
                for t in tags
            ]
        return node.model_copy(update={"tags": tags, "stop_after_first": True})
    if isinstance(node, TagsWithSeparatorFormat) and not node.stop_after_first:
        tags = [_bounded(t, parallel) for t in node.tags]
        if not parallel:
            return node.model_copy(update={"tags": tags, "stop_after_first": True})
        calls = SequenceFormat(elements=[OrFormat(elements=tags), _more(tags, node.separator)])
        return calls if node.at_least_one else OptionalFormat(content=calls)
    if isinstance(node, BaseModel):
        update = {name: _bounded(getattr(node, name), parallel) for name in type(node).model_fields}
        return node.model_copy(update=update)
    if isinstance(node, list):
        return [_bounded(item, parallel) for item in node]
    return node


def _more(tags: list[TagFormat], separator: str, *, optional_separator: bool = False) -> Any:
    """Up to `MAX_PARALLEL_CALLS` - 1 further calls, each after `separator`."""
    sep: Any = ConstStringFormat(value=separator)
    if optional_separator:
        sep = OptionalFormat(content=sep)
    one = SequenceFormat(elements=[sep, OrFormat(elements=list(tags))]) if separator else None
    return RepeatFormat(
        min=0, max=MAX_PARALLEL_CALLS - 1, content=one or OrFormat(elements=list(tags))
    )
