"""CHAT_TEMPLATE (LMI's OPTION_CHAT_TEMPLATE): a chat template in place of the model's own,
read as vLLM's `--chat-template` reads it (vLLM's own loader): a file, one of vLLM's built-in
templates by name, or the template itself."""

from __future__ import annotations

from vllm.exceptions import VLLMValidationError
from vllm.renderers.chat_utils import load_chat_template

from gateway.config.settings import ConfigError


def configured_chat_template(value: str) -> str | None:
    """The template CHAT_TEMPLATE gives, or None (empty: the model's own)."""
    if not value:
        return None
    try:
        template = load_chat_template(value)
    except (OSError, VLLMValidationError) as e:
        raise ConfigError(f"CHAT_TEMPLATE: {e}") from e
    if not template:
        raise ConfigError(f"CHAT_TEMPLATE: {value!r} is empty")
    return template
