"""Scenarios that measure engine variants, each in a child process of its own
(`python -m gateway_bench NAME --child ...`): the order they run in and each child's figures."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

RESULT = "RESULT "  # the child's line that carries its figures, as JSON


def alternating(variants: Sequence[str], repeats: int) -> Iterator[tuple[int, str]]:
    """(repeat, variant): every variant each repeat, the order reversed every other repeat, so
    slow drift on a shared machine spreads over all."""
    for repeat in range(repeats):
        for name in variants if repeat % 2 == 0 else list(reversed(variants)):
            yield repeat, name


def result_line(figures: Mapping[str, Any]) -> str:
    """What a child prints for its parent to read."""
    return RESULT + json.dumps(figures)


def child_figures(name: str, argv: Sequence[str], env: Mapping[str, str]) -> dict[str, Any] | None:
    """The figures of `python -m gateway_bench *argv` (variant `name`), or None where it printed
    none (its error output's end printed here)."""
    command = [sys.executable, "-m", "gateway_bench", *argv]
    out = subprocess.run(command, env=dict(env), capture_output=True, text=True, check=False)
    line = next((x for x in out.stdout.splitlines() if x.startswith(RESULT)), None)
    if line is None:
        print(f"{name}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
        return None
    figures: dict[str, Any] = json.loads(line.removeprefix(RESULT))
    return figures


def every_variant(
    variants: Sequence[str],
    repeats: int,
    argv: Callable[[str], Sequence[str]],
    env: Callable[[str], Mapping[str, str]],
    shown: Callable[[dict[str, Any]], object] = lambda figures: figures,
) -> dict[str, list[dict[str, Any]]]:
    """Every variant `repeats` times in alternating order, each in a child process
    (`python -m gateway_bench *argv(variant)`, environment `env(variant)`): each run's figures
    by variant, printed as they come (`shown(figures)`; a failed run left out, its error
    printed)."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    for repeat, name in alternating(variants, repeats):
        figures = child_figures(name, argv(name), env(name))
        if figures is not None:
            runs[name].append(figures)
            print(f"{name} (repeat {repeat + 1}): {json.dumps(shown(figures))}", flush=True)
    return runs
