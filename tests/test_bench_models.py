"""`llm-gateway bench models --quick`: a gateway of its own (a subprocess on a MODELS_FILE, so its
processes' memory can be read), two swaps and two loads and unloads of the keep_alive = 0 model,
vLLM's server not started. What this asserts is the report's shape (its tables, columns and goal
lines), never a figure: docs/BENCHMARKS.md, "Several models", has those."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

pytest.importorskip("aiohttp", reason="the bench extra is not installed")


@pytest.mark.own_engine  # a bench scenario's run, its gateway and engines its own: test-all
def test_a_quick_models_run_reports_its_tables_and_goals(tmp_path: Path) -> None:
    from gateway_bench.models_bench import parse, run_models
    from gateway_bench.models_report import (
        COLD_COLUMNS,
        LOADS_COLUMNS,
        MEMORY_COLUMNS,
        MEMORY_GOAL,
        SWAP_COLUMNS,
        TTFT_COLUMNS,
        TTFT_GOAL,
        report,
    )

    options = parse(["--quick", "--out", str(tmp_path)])
    result, out = asyncio.run(run_models(options, "bench models --quick"))
    assert not result.notes, result.notes
    assert len(result.swaps) == 2 and len(result.cycles_s) == 3  # a warm cycle, then 2
    assert len(result.idle_ms) == 2 and result.loading_ms
    assert [m.processes for m in result.memory][-1] <= result.memory[0].processes
    text = report(result).markdown()
    for columns in (COLD_COLUMNS, TTFT_COLUMNS, SWAP_COLUMNS, MEMORY_COLUMNS, LOADS_COLUMNS):
        assert "| " + " | ".join(columns) + " |" in text
    assert "| vllm-server (started) | - | - | - | not measured | - |" in text  # not started
    assert f"| {TTFT_GOAL} |" in text and f"| {MEMORY_GOAL} |" in text
    assert "not measured" in text.split("## Goals")[1]  # two cycles: the memory goal not judged
    assert json.loads((out / "report.json").read_text())["swaps"]
    assert (out / "models.toml").is_file() and (out / "gateway.log").is_file()


def test_the_options_read_their_flags() -> None:
    from gateway_bench.models_bench import parse

    options = parse(["--swaps", "3", "--no-vllm-server", "--cycles", "20"])
    assert (options.swaps, options.vllm_server, options.cycles) == (3, False, 20)
    with pytest.raises(SystemExit):
        parse(["--profile"])
