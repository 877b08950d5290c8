"""A scenario's command line from its options Struct: one flag per field, `--quick` a preset."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import msgspec

T = TypeVar("T", bound=msgspec.Struct)


class TargetOptions(msgspec.Struct, kw_only=True):
    """What every scenario that starts its own servers asks of them (a scenario may redeclare a
    field for its own default)."""

    model: str = ""  # "" = the default model
    dtype: str = "auto"
    enforce_eager: bool = False
    start_timeout: float = 900.0
    seed: int = 0
    out: str = "docs/bench"


def parse_options(scenario: str, cls: type[T], quick: Mapping[str, Any], argv: Sequence[str]) -> T:
    """`--field-name VALUE` per field of `cls` (`--flag/--no-flag` for booleans, one or more
    values for lists); `--quick` starts from `quick` instead of the defaults."""
    parser = argparse.ArgumentParser(prog=f"llm-gateway bench --scenario {scenario}")
    parser.add_argument("--scenario", choices=[scenario])
    parser.add_argument("--quick", action="store_true", help="a small run of every part")
    defaults = cls()
    for name in cls.__struct_fields__:
        flag = "--" + name.replace("_", "-")
        default = getattr(defaults, name)
        if isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
        elif isinstance(default, list):
            item = type(default[0]) if default else str  # `--concurrency 1 32`: ints
            parser.add_argument(flag, nargs="+", type=item, default=None)
        else:
            parser.add_argument(flag, type=type(default), default=None)
    given = vars(parser.parse_args(list(argv)))
    preset = quick if given.pop("quick") else {}
    given.pop("scenario")
    chosen = {k: v for k, v in given.items() if v is not None}
    try:
        return msgspec.convert({**preset, **chosen}, cls)
    except msgspec.ValidationError as e:
        parser.error(str(e))
