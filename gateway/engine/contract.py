"""`Engine`: what the engine path, the holder and the served model ask of the chat model's
engine, whether it runs in this process (`VllmEngine`) or as replicas on Ray
(`ReplicaEngine`). Both are typed against it where they are built (the loaders), so mypy
names a member either one lacks.

`TokenizerSide` is the half both do the same way, in this process: the tokenizer, the
model's limits and adapters, and what reads them (tokenizing, chat templates). Each engine's
`__init__` calls its `__init__`, so a field added there is set for both.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from jinja2.exceptions import TemplateError

from gateway.engine.lora import Adapters
from gateway.engine.meter import Meter
from gateway.engine.outputs import EngineStep
from gateway.engine.scheduler_view import SchedulerView
from protocols.errors import invalid
from protocols.events import TokenInfo
from protocols.generation import SamplingOptions


class Engine(Protocol):
    tokenizer: Any  # transformers' (or vLLM's) tokenizer: the served model's own
    max_model_len: int
    dtype: str
    dtype_reason: str
    adapters: Adapters
    scheduler: SchedulerView

    @property
    def healthy(self) -> bool: ...

    @property
    def vocabulary(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template: str | None = None,
    ) -> str: ...

    def retokenize(self, text: str) -> list[TokenInfo]: ...

    def stream(
        self,
        token_ids: list[int],
        options: SamplingOptions,
        meter: Meter | None = None,
        priority: int = 0,
        adapter: str | None = None,
        caller: str = "",
    ) -> AsyncGenerator[EngineStep, None]: ...

    async def complete(
        self,
        token_ids: list[int],
        options: SamplingOptions,
        meter: Meter | None = None,
        priority: int = 0,
        adapter: str | None = None,
        caller: str = "",
    ) -> list[EngineStep]: ...

    async def beam_search(
        self,
        token_ids: list[int],
        options: SamplingOptions,
        meter: Meter | None = None,
        priority: int = 0,
        adapter: str | None = None,
        caller: str = "",
    ) -> list[EngineStep]: ...

    async def load_adapter(self, name: str, path: Path, lora_id: int | None = None) -> None: ...

    async def unload_adapter(self, name: str) -> bool: ...

    def unfinished_requests(self) -> int: ...

    def on_death(self, callback: Callable[[str], None]) -> None: ...

    def death_reason(self) -> str: ...

    def shutdown(self) -> None: ...


class TokenizerSide:
    """The model's tokenizer, limits and adapters, and what reads them, in this process."""

    def __init__(
        self,
        tokenizer: Any,
        eos_token_ids: frozenset[int],
        max_model_len: int,
        dtype: str,
        dtype_reason: str,
        adapters: Adapters,
        scheduler: SchedulerView,
    ) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.dtype = dtype
        self.dtype_reason = dtype_reason
        self.adapters = adapters
        self.scheduler = scheduler

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template: str | None = None,
    ) -> str:
        """The conversation as a prompt, in the model's own chat template (or `chat_template`,
        CHAT_TEMPLATE's), which receives `tools`: ending with the assistant's turn, or
        (`continue_final_message`) inside the last message."""
        if not chat_template and not getattr(self.tokenizer, "chat_template", None):
            raise invalid(
                "This model has no chat template: send `prompt` instead of `messages`", "messages"
            )
        try:
            rendered = self.tokenizer.apply_chat_template(
                list(messages),
                tools=list(tools) if tools is not None else None,
                chat_template=chat_template,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
            )
        except (ValueError, TemplateError) as e:  # no message, or one the template refuses
            raise invalid(f"The chat template cannot render these messages: {e}", "messages") from e
        return str(rendered)

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(token_ids)))

    @property
    def vocabulary(self) -> int:
        """How many token ids the tokenizer knows (0 to this less one)."""
        return len(self.tokenizer)

    def retokenize(self, text: str) -> list[TokenInfo]:
        """`text`'s own tokens, with no log-probability: what is left of a token a stop string
        split (protocols/stop_strings.py)."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return [TokenInfo(i, str(self.tokenizer.decode([i])), float("nan")) for i in ids]
