"""`llm-gateway bench quantized --quick`: bfloat16, int8 and int4 weights each served by an engine
of its own, their rates measured and their greedy answers compared (what this asserts, never a
speed or a quality figure: docs/BENCHMARKS.md has those)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("aiohttp", reason="the bench extra is not installed")


@pytest.mark.own_engine  # three engines of the scenario's own: make test-all
def test_the_quick_quantized_scenario_serves_every_variant(tmp_path: Path) -> None:
    from gateway_bench.quantized_bench import BASE, SCENARIO, VARIANTS, agreement, measure_variants

    options = SCENARIO.parse(["--quick", "--out", str(tmp_path)])
    runs = measure_variants(options)
    assert set(runs) == set(VARIANTS)
    for name, (figures,) in runs.items():
        assert all(figures[f"c{c}"] > 0 for c in options.concurrency), name
        answers = figures["answers"]
        assert len(answers) == options.questions and all(answers), name
    reference = runs[BASE][0]["answers"]
    assert agreement(reference, reference) == (options.questions, 1.0)
