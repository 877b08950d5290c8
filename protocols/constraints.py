"""What a request's output must match, and the wire forms that ask for it (no I/O).

The neutral vocabulary is vLLM's structured outputs (gateway/engine/sampling.py holds the engine
to it, through xgrammar): a JSON schema, a regular expression the whole output matches, a
grammar (EBNF, or Lark), or one of a list of choices. `Constraint` carries one, with the field
the request gave it in, so a constraint the engine cannot compile is refused naming that field
(gateway/engine_path/generation.py). The decoders read each protocol's form:

- TGI's `grammar` (`/generate`, `/generate_stream`, `/`, and `/invocations` under
  OPTION_TGI_COMPAT) and its Messages API `response_format`: `{"type": "json" | "json_object",
  "value": <schema, or its JSON text>}`, `{"type": "json_schema", "value": {"name", "schema"}}`,
  `{"type": "regex", "value": <pattern>}`;
- OpenAI's `response_format` (`text`, `json_object`, `json_schema`), beside TGI's forms;
- OpenAI's Responses API `text.format`: the same three, the schema's fields flat
  (`{"type": "json_schema", "name", "schema", "strict"}`);
- vLLM's `structured_outputs` (`json`, `regex`, `choice`, `grammar`, `json_object`), which
  vLLM's server and LMI (passing its parameters through to vLLM) take;
- LMI's `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`: the same, as LMI took
  them while its vLLM had them (before vLLM 0.12).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from protocols.errors import GenerationError, invalid, validation_error
from protocols.generation import NonEmpty, SamplingOptions
from protocols.json_body import MALFORMED

ConstraintKind = Literal["json", "regex", "grammar", "choice"]
ANY_OBJECT = '{"type": "object"}'  # OpenAI's and vLLM's `json_object`: some JSON object
MAX_CHOICES = 1024  # each choice is a branch of the grammar vLLM builds


class Constraint(msgspec.Struct, frozen=True):
    """One constraint: `value` is a JSON schema's text (`json`), a pattern the whole output
    matches (`regex`), an EBNF or Lark grammar (`grammar`), or the choices (`choice`, one of
    them is the whole output); `field` is where the request gave it (`$.parameters.grammar`)."""

    kind: ConstraintKind
    value: str | tuple[str, ...]
    field: str


class UncompilableConstraint(GenerationError):
    """The engine's grammar backend refused the request's constraint (the engine path names the
    request's field, `GenerationRequest.constraint_field`)."""


def constrained(options: SamplingOptions, constraint: Constraint | None) -> SamplingOptions:
    """`options` holding the output to `constraint` (None: as they are)."""
    if constraint is None:
        return options
    value = constraint.value
    match constraint.kind:
        case "json":
            return msgspec.structs.replace(options, json_schema=str(value))
        case "regex":
            return msgspec.structs.replace(options, regex=str(value))
        case "grammar":
            return msgspec.structs.replace(options, grammar=str(value))
        case "choice":
            return msgspec.structs.replace(options, choice=tuple(value))


def is_constrained(options: SamplingOptions) -> bool:
    return any(
        v is not None for v in (options.json_schema, options.regex, options.grammar, options.choice)
    )


def only_one(*constraints: Constraint | None) -> Constraint | None:
    """The one constraint given; a second is refused naming its field."""
    given = [c for c in constraints if c is not None]
    if len(given) > 1:
        first, second = given[0], given[1]
        raise invalid(
            f"Only one output constraint per request: `{first.field}` is given already - at "
            f"`{second.field}`",
            second.field,
        )
    return given[0] if given else None


def schema_text(schema: Any, field: str) -> str:
    """A JSON schema (an object, or its JSON text) as JSON text; anything else is refused."""
    if isinstance(schema, str):
        try:
            schema = msgspec.json.decode(schema)
        except MALFORMED as e:
            raise invalid(f"The JSON schema is not valid JSON ({e}) - at `{field}`", field) from e
    if not isinstance(schema, dict):
        raise invalid(
            f"A JSON schema is an object (or its JSON text), got `{type(schema).__name__}` - at "
            f"`{field}`",
            field,
        )
    return msgspec.json.encode(schema).decode()


def _converted(value: Any, kind: Any, field: str) -> Any:
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as e:
        raise validation_error(e, field) from e


# --- TGI: `grammar`, and the Messages API's `response_format` ----------


class _SchemaConfig(msgspec.Struct, kw_only=True):
    schema_: Any = msgspec.field(name="schema")
    name: str | None = None
    strict: bool | None = None


class _Json(msgspec.Struct, tag="json", forbid_unknown_fields=True):
    value: Any


class _JsonObject(msgspec.Struct, tag="json_object", forbid_unknown_fields=True):
    value: Any


class _JsonSchema(msgspec.Struct, tag="json_schema", forbid_unknown_fields=True):
    value: _SchemaConfig


class _Regex(msgspec.Struct, tag="regex", forbid_unknown_fields=True):
    value: str


_TgiGrammar = _Json | _JsonObject | _JsonSchema | _Regex


def tgi_grammar(value: Any, field: str) -> Constraint:
    """TGI's `GrammarType`: `{"type": "json" | "json_object", "value": <schema or its text>}`,
    `{"type": "json_schema", "value": {"name", "schema"}}` or `{"type": "regex", "value": ...}`."""
    if not isinstance(value, Mapping) or "type" not in value:
        raise invalid(
            'A grammar is {"type": "json" | "json_object" | "json_schema" | "regex", "value": '
            f"...}} - at `{field}`",
            field,
        )
    grammar = _converted(value, _TgiGrammar, field)
    match grammar:
        case _Json(value=schema) | _JsonObject(value=schema):
            return Constraint("json", schema_text(schema, f"{field}.value"), field)
        case _JsonSchema(value=config):
            return Constraint("json", schema_text(config.schema_, f"{field}.value.schema"), field)
        case _Regex(value=pattern):
            return Constraint("regex", pattern, field)
    raise AssertionError(grammar)  # pragma: no cover


# --- OpenAI's `response_format`, and TGI's forms of it ----------


class JsonSchemaFormat(msgspec.Struct, kw_only=True):
    name: str = "answer"
    schema_: dict[str, Any] = msgspec.field(default_factory=dict, name="schema")
    strict: bool | None = None


class ResponseFormat(msgspec.Struct, kw_only=True):
    """OpenAI's (`text`, `json_object`, `json_schema` with `json_schema`) and TGI's (`json`,
    `json_object`, `json_schema` or `regex`, with `value`)."""

    type: Literal["text", "json_object", "json_schema", "json", "regex"]
    json_schema: JsonSchemaFormat | None = None
    value: Any = None


def response_format(fmt: ResponseFormat, field: str = "response_format") -> Constraint | None:
    """The constraint a chat request's `response_format` asks for (None: free text).

    Without a `value`, `json_object` is OpenAI's "some JSON object"; with one, TGI's schema.
    """
    if fmt.type == "text":
        return None
    if fmt.value is not None:
        return tgi_grammar({"type": fmt.type, "value": fmt.value}, field)
    match fmt.type:
        case "json_object":
            return Constraint("json", ANY_OBJECT, field)
        case "json_schema":
            if fmt.json_schema is None:
                raise invalid(
                    f"json_schema needs its `json_schema` - at `{field}.json_schema`",
                    f"{field}.json_schema",
                )
            schema = msgspec.json.encode(fmt.json_schema.schema_).decode()
            return Constraint("json", schema, f"{field}.json_schema.schema")
        case _:
            raise invalid(f"`{fmt.type}` needs its `value` - at `{field}.value`", f"{field}.value")


class TextFormat(msgspec.Struct, kw_only=True):
    """The Responses API's `text.format`."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: Any = msgspec.field(default=None, name="schema")
    description: str | None = None
    strict: bool | None = None


def text_format(fmt: TextFormat, field: str = "text.format") -> Constraint | None:
    """The constraint a Responses request's `text.format` asks for (None: free text)."""
    match fmt.type:
        case "text":
            return None
        case "json_object":
            return Constraint("json", ANY_OBJECT, field)
        case "json_schema":
            if fmt.schema_ is None:
                raise invalid(
                    f"json_schema needs its `schema` - at `{field}.schema`", f"{field}.schema"
                )
            where = f"{field}.schema"
            return Constraint("json", schema_text(fmt.schema_, where), where)


# --- vLLM's `structured_outputs`, and LMI's `guided_*` ----------


Choices = Annotated[list[str], Meta(min_length=1, max_length=MAX_CHOICES)]


class StructuredOutputs(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """vLLM's `structured_outputs` request field: exactly one of its constraints."""

    json: Any = None
    regex: str | None = None
    choice: Choices | None = None
    grammar: NonEmpty | None = None
    json_object: Literal[True] | None = None


def structured_outputs(value: Any, field: str) -> Constraint:
    """vLLM's `structured_outputs` object: exactly one of `json` (a schema, or its text),
    `regex`, `choice`, `grammar`, `json_object: true`."""
    parsed = _converted(value, StructuredOutputs, field)
    given = [
        name for name in StructuredOutputs.__struct_fields__ if getattr(parsed, name) is not None
    ]
    if len(given) != 1:
        raise invalid(
            "structured_outputs takes exactly one of `json`, `regex`, `choice`, `grammar`, "
            f"`json_object`; got {len(given)} - at `{field}`",
            field,
        )
    name = given[0]
    where = f"{field}.{name}"
    match name:
        case "json":
            return Constraint("json", schema_text(parsed.json, where), where)
        case "json_object":
            return Constraint("json", ANY_OBJECT, where)
        case "choice":
            return Constraint("choice", tuple(parsed.choice or ()), where)
        case "regex":
            return Constraint("regex", parsed.regex or "", where)
        case _:
            return Constraint("grammar", parsed.grammar or "", where)


def guided(
    path: str,
    *,
    json: Any = None,
    regex: str | None = None,
    choice: list[str] | None = None,
    grammar: str | None = None,
) -> Constraint | None:
    """LMI's (and vLLM's before 0.12) `guided_json`, `guided_regex`, `guided_choice`,
    `guided_grammar`, given under `path` (`$.parameters`); two are refused."""
    found: list[Constraint | None] = []
    if json is not None:
        where = f"{path}.guided_json"
        found.append(Constraint("json", schema_text(json, where), where))
    if regex is not None:
        found.append(Constraint("regex", regex, f"{path}.guided_regex"))
    if choice is not None:
        found.append(Constraint("choice", tuple(choice), f"{path}.guided_choice"))
    if grammar is not None:
        found.append(Constraint("grammar", grammar, f"{path}.guided_grammar"))
    return only_one(*found)


def placed(error: GenerationError, field: str | None) -> GenerationError:
    """An `UncompilableConstraint` as a refusal naming the request's constraint field."""
    if not isinstance(error, UncompilableConstraint) or field is None:
        return error
    return GenerationError(error.kind, f"{error.message} - at `{field}`", field)
