"""The chat template the gateway renders conversations with.

CHAT_TEMPLATE (LMI's OPTION_CHAT_TEMPLATE) gives one in place of the model's own, read as
vLLM's `--chat-template` reads it (vLLM's own loader): a file, one of vLLM's built-in templates
by name, or the template itself. Without it, the embedded default model is served with the
gateway's template for it (templates/smollm2-tools.jinja: its own, and Hermes-style tool calls
when a request has `tools`, which the `hermes` parser reads); any other model with its own.
"""

from __future__ import annotations

from pathlib import Path

from vllm.exceptions import VLLMValidationError
from vllm.renderers.chat_utils import load_chat_template

from gateway.config.settings import ConfigError, Settings

DEFAULT_MODEL_TEMPLATE = Path(__file__).parent / "templates" / "smollm2-tools.jinja"


def served_chat_template(settings: Settings) -> str | None:
    """The template conversations are rendered with (None: the model's own)."""
    if settings.chat_template or settings.engine.model:
        return configured_chat_template(settings.chat_template)
    return DEFAULT_MODEL_TEMPLATE.read_text()


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
