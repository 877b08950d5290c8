"""`llm-gateway bench quantized --quick`: the int8 and int4 copies each served by an engine of its
own, their rates measured and their greedy answers given (what this asserts, never a speed or a
quality figure: docs/BENCHMARKS.md has those). bfloat16, the third variant, is the default
engine every other test serves."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("aiohttp", reason="the bench extra is not installed")


@pytest.mark.own_engine  # two engines of the scenario's own: make test-all
def test_the_quick_quantized_scenario_serves_both_quantized_copies(tmp_path: Path) -> None:
    import json

    from gateway_bench.quantize import FORMATS
    from gateway_bench.quantized_bench import SCENARIO, checkpoint, measure_variants

    options = SCENARIO.parse(["--quick", "--variants", *FORMATS, "--out", str(tmp_path)])
    runs = measure_variants(options)
    assert set(runs) == set(FORMATS)
    for name, (figures,) in runs.items():
        assert all(figures[f"c{c}"] > 0 for c in options.concurrency), name
        answers = figures["answers"]
        assert len(answers) == options.questions and all(answers), name
        # What was served is the quantized copy (vLLM refuses its tensors as plain weights).
        config = json.loads((checkpoint(name) / "config.json").read_text())
        assert config["quantization_config"]["quant_method"] == "compressed-tensors", name
