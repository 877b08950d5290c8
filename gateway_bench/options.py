"""The bench's command line: one subcommand per scenario, its flags read from its options Struct.

Every scenario's options are a Struct deriving from `Options` (the engine every target the
bench starts runs, the output directory and the timeouts), so every scenario reads them alike:
`--field-name VALUE` per field, `--flag/--no-flag` for booleans, one or more values (or a
comma-separated list) for a list, `N` or `N-M` for a span; `--quick` starts from the
scenario's preset instead of the defaults. msgspec checks and converts what was given.
"""

from __future__ import annotations

import argparse
import asyncio
import typing
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Generic, TypeVar

import msgspec

from gateway.config.settings import EngineSettings
from gateway_bench import machine
from gateway_bench.machine import Machine

Positive = Annotated[int, msgspec.Meta(ge=1)]
Share = Annotated[float, msgspec.Meta(ge=0, lt=1)]
_DEFAULTS = EngineSettings()
_HELP = {
    "profile": "record a py-spy profile (speedscope) of the server under test during each "
    "measured step, in OUT/profiles/",
}
_CHOICES = {"dtype": typing.get_args(typing.get_type_hints(EngineSettings)["dtype"])}


class Options(msgspec.Struct, frozen=True, kw_only=True):
    """What every scenario asks of the servers it starts, and how it runs (a scenario may
    redeclare a field for its own default)."""

    model: str = ""  # a model directory or hub id; "": the gateway's embedded default model
    max_model_len: Positive = _DEFAULTS.max_model_len
    kv_cache_gib: float = _DEFAULTS.kv_cache_gib
    enforce_eager: bool = _DEFAULTS.enforce_eager
    dtype: str = "auto"  # as DTYPE; "auto" resolves as the gateway does (machine.py)
    seed: int = 0
    out: str = ""  # "": bench-results/<UTC time> (the soak's: soak-<UTC time>)
    progress: bool = True
    start_timeout: float = 900.0  # seconds a server may take to be ready
    request_timeout: float = 300.0  # seconds one request may take
    profile: bool = False  # a py-spy profile of the server under test in each measured step
    quick: bool = False

    def engine_settings(self, dtype: str | None = None) -> EngineSettings:
        """The engine settings; `dtype` the resolved one (machine.cpu_defaults), else as asked."""
        chosen = msgspec.structs.asdict(EngineSettings())
        chosen |= {"model": self.model, "max_model_len": self.max_model_len, "seed": self.seed}
        chosen |= {"kv_cache_gib": self.kv_cache_gib, "enforce_eager": self.enforce_eager}
        return EngineSettings(**{**chosen, "dtype": dtype or self.dtype})

    def profiles(self, out: Path) -> Path | None:
        """Where `--profile` puts each step's profile (docs/BENCHMARKS.md, "Profiles")."""
        return out / "profiles" if self.profile else None

    def out_dir(self, prefix: str = "") -> Path:
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        return Path(self.out or f"bench-results/{prefix}{stamp}")


OptionsT = TypeVar("OptionsT", bound=Options)
# A scenario's run: its options and its command line -> its report's Markdown, where the
# report was written (None: nowhere), and whether every goal it judges held (the exit status).
Run = Callable[[OptionsT, str], Coroutine[Any, Any, tuple[str, Path | None, bool]]]


async def begin(options: Options, files: int = 0, prefix: str = "") -> tuple[Path, Machine]:
    """A run's start: its output directory made, the open-file limit raised towards `files`,
    the machine described."""
    out = options.out_dir(prefix)
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    machine.raise_file_limit(files)
    return out, await asyncio.to_thread(machine.describe, options.dtype)


def _items(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _span(text: str) -> list[str]:
    low, _, high = text.partition("-")
    return [low, high or low]


@dataclass(frozen=True)
class Scenario(Generic[OptionsT]):
    """One subcommand: its options, its `--quick` preset, its checks and its run."""

    name: str
    summary: str
    options: type[OptionsT]
    quick: OptionsT  # the `--quick` preset
    run: Run[OptionsT]
    help: Mapping[str, str] = field(default_factory=dict)  # a field's flag: what it sets
    check: Callable[[OptionsT], str | None] = lambda _: None  # an error message, or None

    def fill(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--quick", action="store_true", help="a small run of every part")
        hints = typing.get_type_hints(self.options)
        defaults = self.options()
        for name in self.options.__struct_fields__:
            if name == "quick":
                continue
            flag, default = "--" + name.replace("_", "-"), getattr(defaults, name)
            shown = ",".join(map(str, default)) if isinstance(default, list | tuple) else default
            text = {**_HELP, **self.help}.get(name, "")
            text += f" (default {shown})" if shown not in ("", None) else ""
            kind: dict[str, Any] = {"default": None, "help": text.strip() or None}
            if name in _CHOICES:
                kind["choices"] = _CHOICES[name]
            if isinstance(default, bool):
                kind["action"] = argparse.BooleanOptionalAction
            elif typing.get_origin(hints[name]) is tuple and ... not in typing.get_args(
                hints[name]
            ):
                kind["type"] = _span
            elif isinstance(default, list | tuple):
                kind |= {"nargs": "+", "type": _items}
            parser.add_argument(flag, **kind)

    def options_of(self, given: dict[str, Any], parser: argparse.ArgumentParser) -> OptionsT:
        preset = msgspec.to_builtins(self.quick if given.pop("quick") else self.options())
        chosen = {k: v for k, v in given.items() if v is not None}
        for name, value in chosen.items():  # nargs="+" of comma lists: one list
            if isinstance(value, list) and value and isinstance(value[0], list):
                chosen[name] = [item for items in value for item in items]
        try:
            options = msgspec.convert({**preset, **chosen}, self.options, strict=False)
        except msgspec.ValidationError as e:
            parser.error(str(e))
        if (error := self.check(options)) is not None:
            parser.error(error)
        return options

    def parse(self, argv: Sequence[str]) -> OptionsT:
        """This scenario's flags alone (`argv` after the subcommand's name)."""
        parser = argparse.ArgumentParser(prog=f"llm-gateway bench {self.name}")
        self.fill(parser)
        return self.options_of(vars(parser.parse_args(list(argv))), parser)
