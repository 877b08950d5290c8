"""Where the gateway keeps what it makes once: the converted default model, feedback."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """$LLM_GATEWAY_CACHE if set, else $XDG_CACHE_HOME/llm-gateway or ~/.cache/llm-gateway."""
    explicit = os.environ.get("LLM_GATEWAY_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "llm-gateway"
