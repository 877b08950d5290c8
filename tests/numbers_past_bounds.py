"""Numbers past their bounds, for every numeric field of a JSON Schema: where each field is,
the numbers just past each bound and the extremes (explicit), and a Hypothesis strategy for
any other past them. Used over the served OpenAPI document (tests/test_fuzz_http.py) and over
the decoders' own types (tests/test_fuzz_decoders.py).

A number is JSON text: `1e400` (past a double, the nearest JSON has to an infinity) cannot be
a Python float in a document, so a body is written with a placeholder that the text replaces.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from types import EllipsisType
from typing import Any

from hypothesis import strategies as st

# A place in a body: a property's name, an array's first item (0), or a map's value (...).
Place = tuple[str | int | EllipsisType, ...]
Schema = dict[str, Any]
HUGE, LOWEST = 2**64, -(2**63) - 1  # past an unsigned and a signed 64-bit integer
PAST_A_DOUBLE = ("1e400", "-1e400")
_NUMBER = "\x00number\x00"


def numeric_places(
    schema: Schema,
    definitions: dict[str, Schema],
    place: Place = (),
    seen: frozenset[str] = frozenset(),
) -> Iterator[tuple[Place, Schema]]:
    """Every numeric field of `schema` (whose `$ref`s name `definitions`), with its place."""
    name, schema = resolved(schema, definitions)
    if name in seen:
        return
    seen = seen | {name} if name else seen
    for alternative in schema.get("anyOf", []) + schema.get("oneOf", []):
        yield from numeric_places(alternative, definitions, place, seen)
    if schema.get("type") in ("integer", "number"):
        yield place, schema
    for key, value in schema.get("properties", {}).items():
        yield from numeric_places(value, definitions, (*place, key), seen)
    if isinstance(schema.get("additionalProperties"), dict):
        yield from numeric_places(schema["additionalProperties"], definitions, (*place, ...), seen)
    if isinstance(schema.get("items"), dict):
        yield from numeric_places(schema["items"], definitions, (*place, 0), seen)


def resolved(schema: Schema, definitions: dict[str, Schema]) -> tuple[str | None, Schema]:
    """A `$ref` as the definition's name and schema; any other schema as it is."""
    ref = schema.get("$ref")
    if ref is None:
        return None, schema
    name = ref.rsplit("/", 1)[1]
    return name, definitions[name]


def past_bounds(schema: Schema) -> tuple[list[str], st.SearchStrategy[str]]:
    """A numeric field's numbers past its bounds, as JSON text: the nearest on each side and
    the extremes, then a strategy for any other. A field without both bounds fails here."""
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    high = schema.get("maximum", schema.get("exclusiveMaximum"))
    assert low is not None and high is not None, f"a number without both bounds: {schema}"
    if schema["type"] == "integer":
        below = int(low) - (0 if "exclusiveMinimum" in schema else 1)
        above = int(high) + (0 if "exclusiveMaximum" in schema else 1)
        explicit = [str(n) for n in (below, above, HUGE, LOWEST)]
        drawn = st.integers(max_value=below) | st.integers(min_value=above)
        return list(dict.fromkeys(explicit)), drawn.map(str)
    below_f = low if "exclusiveMinimum" in schema else math.nextafter(low, -math.inf)
    above_f = high if "exclusiveMaximum" in schema else math.nextafter(high, math.inf)
    explicit = [repr(below_f), repr(above_f), str(HUGE), "-1e308", "1e308", *PAST_A_DOUBLE]
    drawn_f = st.floats(max_value=below_f, allow_infinity=False) | st.floats(
        min_value=above_f, allow_infinity=False
    )
    outside = [e for e in dict.fromkeys(explicit) if not _within(schema, float(e))]
    return outside, drawn_f.map(repr)


def _within(schema: Schema, number: float) -> bool:
    low: float = schema.get("minimum", -math.inf)
    low_excluded: float = schema.get("exclusiveMinimum", -math.inf)
    high: float = schema.get("maximum", math.inf)
    high_excluded: float = schema.get("exclusiveMaximum", math.inf)
    return low <= number <= high and low_excluded < number < high_excluded


def with_number(body: Any, place: Place, number: str) -> str:
    """`body` as JSON text with `number` at `place`, whatever was there (a missing object or
    array made)."""
    return json.dumps(_placed(body, place)).replace(json.dumps(_NUMBER), number)


def _placed(body: Any, place: Place) -> Any:
    if not place:
        return _NUMBER
    head, *rest = place
    if isinstance(head, str):
        inner = body if isinstance(body, dict) else {}
        return {**inner, head: _placed(inner.get(head), tuple(rest))}
    if head is ...:
        return {"0": _placed(None, tuple(rest))}
    first = body[0] if isinstance(body, list) and body else None
    return [_placed(first, tuple(rest))]


def field_name(place: Place) -> str:
    """The field as the protocols name it: msgspec's path, less its `$.`."""
    name = ""
    for part in place:
        name += f".{part}" if isinstance(part, str) else "[...]" if part is ... else "[0]"
    return name.removeprefix(".")
