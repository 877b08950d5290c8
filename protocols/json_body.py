"""Reading a request body as a JSON object: the first step of every JSON protocol."""

from __future__ import annotations

from typing import Any

import msgspec

from protocols.errors import GenerationError, invalid

# Everything msgspec raises for a body it cannot read, typed decoders included: malformed JSON
# (ValidationError, a DecodeError, is caught before this by the decoders that check a type),
# nesting deeper than the interpreter's recursion limit, and bytes that are not UTF-8 (or a
# str holding lone surrogates). Every decoder catches this tuple, so none of them is a 500.
MALFORMED: tuple[type[Exception], ...] = (msgspec.DecodeError, RecursionError, UnicodeError)

# Untyped, as the first step before a protocol's types: a number past a double (`1e400`) is
# read as an infinity, which the typed step then refuses naming its field (every float has
# both bounds, protocols/generation.py), where msgspec's own "Number out of range" here
# could only say `$[...]`.
JSON_DECODER = msgspec.json.Decoder(float_hook=float)


def _not_utf8_at(raw: object) -> str | None:
    """Where `raw` stops being UTF-8 (a str: where it holds a lone surrogate), or None.

    Asked of the body itself, not of msgspec's error: the releases word and type that error
    differently (0.23 raises a DecodeError saying "Invalid UTF-8", earlier ones a UnicodeError)."""
    try:
        if isinstance(raw, bytes):
            raw.decode("utf-8")
        elif isinstance(raw, str):
            raw.encode("utf-8")
    except UnicodeDecodeError as e:
        return f"byte {e.start}"
    except UnicodeEncodeError as e:
        return f"character {e.start}"
    return None


def malformed(error: Exception, raw: object = None) -> GenerationError:
    """One of MALFORMED, raised reading `raw`, as the invalid request it is, at `$`."""
    if isinstance(error, RecursionError):
        reason = "nested too deeply"
    elif (where := _not_utf8_at(raw)) is not None:
        reason = f"not valid UTF-8 (at {where})"
    elif isinstance(error, UnicodeError):
        reason = "not valid UTF-8"
    else:
        reason = str(error)
    return invalid(f"Malformed JSON: {reason}", "$")


def decode_json_object(raw: bytes | str) -> dict[str, Any]:
    """The body's object; a body that is not JSON, or not an object, fails at `$`."""
    try:
        doc = JSON_DECODER.decode(raw)
    except MALFORMED as e:
        raise malformed(e, raw) from e
    if not isinstance(doc, dict):
        raise invalid(f"Expected `object`, got `{type(doc).__name__}` - at `$`", "$")
    return doc
