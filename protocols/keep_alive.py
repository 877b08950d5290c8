"""Ollama's keep_alive, the one reading of it for MODELS_FILE and for Ollama's requests: seconds
(a number or its string), a Go duration ("5m", "1h30m", "90s", "250ms"), negative: forever."""

from __future__ import annotations

import re

from protocols.errors import invalid

FOREVER = -1.0  # never unloaded for idleness
_DURATION = re.compile(r"(\d+(\.\d+)?(ms|s|m|h))+")
_PARTS = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_seconds(value: float | str, field: str = "keep_alive") -> float:
    """`value` in seconds (FOREVER for a negative one); GenerationError naming `field` when it
    is no duration."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return FOREVER if value < 0 else float(value)
    text = str(value).strip()
    if text.startswith("-"):
        return FOREVER
    try:
        return float(text)
    except ValueError:
        pass
    if not _DURATION.fullmatch(text):
        raise invalid(f"keep_alive {value!r} is not a duration (5m, 90s, 300, -1)", field)
    return sum(float(n) * _UNIT_SECONDS[unit] for n, unit in _PARTS.findall(text))
