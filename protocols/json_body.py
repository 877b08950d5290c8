"""Reading a request body as a JSON object: the first step of every JSON protocol."""

from __future__ import annotations

from typing import Any

import msgspec

from protocols.errors import invalid

_JSON_DECODER = msgspec.json.Decoder()


def decode_json_object(raw: bytes | str) -> dict[str, Any]:
    """The body's object; a body that is not JSON, or not an object, fails at `$`."""
    try:
        doc = _JSON_DECODER.decode(raw)
    except msgspec.DecodeError as e:
        raise invalid(f"Malformed JSON: {e}", "$") from e
    if not isinstance(doc, dict):
        raise invalid(f"Expected `object`, got `{type(doc).__name__}` - at `$`", "$")
    return doc
