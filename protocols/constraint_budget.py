"""How large an output constraint may be: checked before the engine sees it (no I/O).

The engine's grammar backend (xgrammar) compiles a constraint against the whole vocabulary, and
its cost grows faster than the constraint: measured on a 2-core machine (SmolLM2's 49,152
tokens, one thread, CPU seconds), a regex of 10,000 alternated words (79 KB) 0.1 s, of 30,000
(259 KB) 1.2 s, of 50,000 about 70 s; a schema of 300 optional properties 0.17 s, of 1,000
3.3 s; an enum of 5,000 strings 0.07 s, of 20,000 1.4 s, of 100,000 past 11 GB of memory.
Each limit is a setting (gateway/config/settings.py, docs/SECURITY.md); a constraint past one
is refused at once, naming the field and the limit. What is admitted is compiled once more
within a time and memory budget (gateway/engine/constraint_check.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from protocols.errors import invalid
from protocols.generation import SamplingOptions

# The field of the grammar the gateway builds from OpenAI `tools` (gateway/engine/tool_calls.py):
# its schemas are held to the budget as schemas (`check_tools`), not as the grammar they become,
# which is larger (500 string properties: about 100 KB of grammar).
TOOLS_FIELD = "tools"


class ConstraintBudget(msgspec.Struct, frozen=True, kw_only=True):
    """The largest constraint a request may give (each limit names its setting)."""

    max_regex_chars: int = 64 * 1024
    max_grammar_chars: int = 64 * 1024
    max_schema_bytes: int = 128 * 1024
    max_schema_properties: int = 500
    max_schema_enum_values: int = 5000
    max_schema_depth: int = 32
    max_choices: int = 1024
    max_choice_chars: int = 64 * 1024


def _past(what: str, given: int, limit: int, setting: str, field: str) -> Exception:
    return invalid(
        f"The {what} is {given}, past this server's limit of {limit} ({setting}) - at `{field}`",
        field,
    )


def check_options(options: SamplingOptions, field: str | None, budget: ConstraintBudget) -> None:
    """Raises INVALID_REQUEST when the options' constraint is past `budget`, naming `field`
    (where the request gave it) and the limit."""
    if field == TOOLS_FIELD:
        return
    where = field or "constraint"
    if options.regex is not None and len(options.regex) > budget.max_regex_chars:
        raise _past(
            "regex's length", len(options.regex), budget.max_regex_chars, "MAX_REGEX_CHARS", where
        )
    if options.grammar is not None and len(options.grammar) > budget.max_grammar_chars:
        raise _past(
            "grammar's length",
            len(options.grammar),
            budget.max_grammar_chars,
            "MAX_GRAMMAR_CHARS",
            where,
        )
    if options.choice is not None:
        check_choices(options.choice, where, budget)
    if options.json_schema is not None:
        check_schema_bytes(len(options.json_schema.encode()), where, budget)
        check_schema(msgspec.json.decode(options.json_schema), where, budget)


def check_choices(choices: Iterable[str], field: str, budget: ConstraintBudget) -> None:
    listed = list(choices)
    if len(listed) > budget.max_choices:
        raise _past("number of choices", len(listed), budget.max_choices, "MAX_CHOICES", field)
    chars = sum(len(c) for c in listed)
    if chars > budget.max_choice_chars:
        raise _past(
            "choices' total length", chars, budget.max_choice_chars, "MAX_CHOICE_CHARS", field
        )


def check_schema_bytes(size: int, field: str, budget: ConstraintBudget) -> None:
    if size > budget.max_schema_bytes:
        raise _past(
            "JSON schema's size in bytes", size, budget.max_schema_bytes, "MAX_SCHEMA_BYTES", field
        )


def check_schema(schema: Any, field: str, budget: ConstraintBudget) -> None:
    """A decoded JSON schema, walked without recursion: its nesting, the properties it names
    (every `properties` object, counted together) and its enum values (`enum`, counted
    together; a `const` is one)."""
    properties = values = 0
    pending: list[tuple[Any, int]] = [(schema, 1)]
    while pending:
        node, depth = pending.pop()
        if depth > budget.max_schema_depth:
            raise _past(
                "JSON schema's nesting", depth, budget.max_schema_depth, "MAX_SCHEMA_DEPTH", field
            )
        if isinstance(node, dict):
            named = node.get("properties")
            if isinstance(named, dict):
                properties += len(named)
            enum = node.get("enum")
            if isinstance(enum, list):
                values += len(enum)
            children: Iterable[Any] = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        pending.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    if properties > budget.max_schema_properties:
        raise _past(
            "number of properties the JSON schema names",
            properties,
            budget.max_schema_properties,
            "MAX_SCHEMA_PROPERTIES",
            field,
        )
    if values > budget.max_schema_enum_values:
        raise _past(
            "number of enum values in the JSON schema",
            values,
            budget.max_schema_enum_values,
            "MAX_SCHEMA_ENUM_VALUES",
            field,
        )


def check_tools(tools: Iterable[dict[str, Any]], budget: ConstraintBudget) -> None:
    """OpenAI's `tools`: each function's `parameters` is a JSON schema the engine may hold
    output to (`tool_choice` required or named), checked as one; all of them together once
    more, as vLLM combines them into one schema."""
    total_bytes = 0
    combined: list[Any] = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        parameters = function.get("parameters") if isinstance(function, dict) else None
        if parameters is None:
            continue
        where = f"tools[{i}].function.parameters"
        size = len(msgspec.json.encode(parameters))
        check_schema_bytes(size, where, budget)
        check_schema(parameters, where, budget)
        total_bytes += size
        combined.append(parameters)
    if total_bytes > budget.max_schema_bytes:
        raise _past(
            "tools' schemas' total size in bytes",
            total_bytes,
            budget.max_schema_bytes,
            "MAX_SCHEMA_BYTES",
            TOOLS_FIELD,
        )
    check_schema(combined, TOOLS_FIELD, budget)
