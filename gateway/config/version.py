"""The gateway's version, as installed (TGI's `/info` and the OpenAPI document report it)."""

from __future__ import annotations

from importlib import metadata


def version() -> str:
    try:
        return metadata.version("llm-gateway")
    except metadata.PackageNotFoundError:
        return "0.1.0"
