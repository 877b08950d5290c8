"""`ChatModels`: the configured chat models by name, the default among them, and the
residency that loads and unloads them. `find` is where a requested name becomes a model: the
model of that name, or the one serving a LoRA adapter of that name; no name (or TGI's clients'
any-model names) is the default model."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from gateway.engine_path.chat_model import ChatModel
from gateway.engine_path.residency import Residency
from protocols.openai_requests import ANY_MODEL


class ChatModels:
    def __init__(self, models: Sequence[ChatModel], default: str, residency: Residency) -> None:
        self._by_name = {m.name: m for m in models}
        self.default = self._by_name[default]
        self.residency = residency

    def __iter__(self) -> Iterator[ChatModel]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def add(self, model: ChatModel) -> None:
        """A chat model registered at run time (DJL's management API), loaded on demand."""
        self._by_name[model.name] = model
        self.residency.add(model)

    async def remove(self, model: ChatModel) -> None:
        """Forget a model and stop its engine (its prompts end with it)."""
        self._by_name.pop(model.name, None)
        await self.residency.remove(model)

    def named(self, name: str) -> ChatModel | None:
        """The model called `name` (not one of its adapters)."""
        return self._by_name.get(name)

    def find(self, asked: str | None) -> ChatModel | None:
        """The model a request's `asked` name picks (see the module's docstring); None: no
        chat model serves that name."""
        if asked is None or asked in ANY_MODEL:
            return self.default
        found = self._by_name.get(asked)
        if found is not None:
            return found
        return next((m for m in self if asked in adapter_names(m)), None)

    def names(self) -> list[str]:
        """Every name a chat request may give: the models', then their adapters'."""
        adapters = [a for m in self for a in adapter_names(m)]
        return [*self._by_name, *adapters]


def adapter_names(model: ChatModel) -> list[str]:
    """The model's adapters: its engine's once it is loaded, else those it is configured with."""
    if model.holder.engine is not None:
        return list(model.served.adapter_paths())
    return list(model.configured_adapters)
