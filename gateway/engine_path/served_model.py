"""`ServedModel`: what routes may know and ask of the model the gateway serves, with the engine
behind it: its name, context length and dtype, whether it is ready, its tokenizer and chat
template, tool calling, and its LoRA adapters.

Routes reach the engine only through this (and `GenerationService` for generation): the
engine object never leaves the engine path. With several models, a model name picks one of
these; every method is already about this one model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from gateway.config.sampling_defaults import configured_sampling_defaults
from gateway.config.settings import EngineSettings, served_model_name
from gateway.engine.holder import EngineHolder
from gateway.engine.tool_calls import ToolParsing
from gateway.engine_path.generation import tokenized
from protocols.generation import GenerationRequest
from protocols.openai_requests import OpenAICall, spelled
from protocols.tool_calls import ToolAnswers, ToolUse


class ServedModel:
    """The served model: `name` as clients see it; everything else asks the engine, waiting
    for it while it loads (or raising ENGINE_UNAVAILABLE), except what a health check or a
    listing reads as it is now."""

    def __init__(
        self,
        holder: EngineHolder,
        settings: EngineSettings,
        tool_parsing: ToolParsing,
        chat_template: str | None = None,
    ) -> None:
        self._holder = holder
        self._settings = settings
        self._tool_parsing = tool_parsing
        self.chat_template = chat_template  # CHAT_TEMPLATE; None: the model's own
        self.name = served_model_name(settings)
        # what a request leaving sampling fields out samples with (SAMPLING_DEFAULTS)
        self.sampling_defaults = configured_sampling_defaults(settings)

    # --- the engine's state, as it is now ---------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._holder.ready

    def status(self) -> tuple[str, str | None]:
        """(status, error): loading (also while it is rebuilt), ready or failed."""
        return self._holder.describe()

    @property
    def loading(self) -> bool:
        return not self._holder.ready and self._holder.status == "loading"

    def loading_progress(self) -> tuple[float, float]:
        """(percent, eta_seconds), estimated from the time loading usually takes."""
        return self._holder.loading_progress()

    def context_length(self) -> int:
        """The engine's, once it was built; the configured MAX_MODEL_LEN before."""
        engine = self._holder.engine
        return engine.max_model_len if engine is not None else self._settings.max_model_len

    def dtype(self) -> str | None:
        """The engine's dtype (`float32`, `bfloat16`...), None before it was built."""
        engine = self._holder.engine
        return engine.dtype if engine is not None else None

    # --- the tokenizer and the chat template ------------------------------------------------

    async def spell(self, call: OpenAICall) -> OpenAICall:
        """`call` with its token-id prompts checked against the vocabulary and spelled."""
        engine = await self._holder.wait()
        return spelled(call, engine.vocabulary, engine.decode)

    async def tokenize(self, text: str, *, special_tokens: bool = True) -> list[int]:
        """`text`'s token ids (off the event loop for a long text); `special_tokens`: those the
        tokenizer adds (a BOS)."""
        engine = await self._holder.wait()
        encode = partial(engine.tokenizer.encode, add_special_tokens=special_tokens)
        return list(await tokenized(text, encode))

    async def token_strings(self, token_ids: Sequence[int]) -> list[str]:
        engine = await self._holder.wait()
        return list(engine.tokenizer.convert_ids_to_tokens(list(token_ids)))

    async def vocabulary(self) -> int:
        """How many token ids the tokenizer knows (0 to this less one)."""
        return (await self._holder.wait()).vocabulary

    async def decode(self, token_ids: Sequence[int]) -> str:
        return (await self._holder.wait()).decode(token_ids)

    async def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """The conversation as a prompt, in the chat template (CHAT_TEMPLATE, or the model's)."""
        engine = await self._holder.wait()
        return engine.render_chat(
            messages,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tools=tools,
            chat_template=self.chat_template,
        )

    # --- tool calls --------------------------------------------------------------------------

    async def tool_calling(
        self, use: ToolUse, requests: list[GenerationRequest]
    ) -> tuple[ToolAnswers, list[GenerationRequest]]:
        """What reads the answers for `use`'s calls (with the model's tokenizer and the
        configured parsers), and `requests` held to what the calls need."""
        calling = self._tool_parsing.calling(use, await self._holder.wait())
        return calling, calling.constrained(requests)

    # --- LoRA adapters -----------------------------------------------------------------------

    def adapter_paths(self) -> dict[str, Path]:
        """The adapters served now, by name, with where each was loaded from (none before the
        engine was built)."""
        engine = self._holder.engine
        return engine.adapters.paths if engine is not None else {}

    async def adapter_names(self) -> list[str]:
        return (await self._holder.wait()).adapters.names

    async def adapters_enabled(self) -> bool:
        return (await self._holder.wait()).adapters.enabled

    async def adapter_path(self, name: str) -> Path | None:
        """Where the adapter `name` was loaded from; None when it is not served."""
        adapter = (await self._holder.wait()).adapters.find(name)
        return adapter.path if adapter is not None else None

    async def adapter_of(self, name: str | None, field: str) -> str | None:
        """The adapter a request's `name` asks for (None: the base model, however named); an
        unknown one is refused naming `field`."""
        return (await self._holder.wait()).adapters.check(name, field)

    async def load_adapter(self, name: str, path: Path) -> None:
        await (await self._holder.wait()).load_adapter(name, path)

    async def unload_adapter(self, name: str) -> bool:
        """False when no adapter `name` is served."""
        return await (await self._holder.wait()).unload_adapter(name)
