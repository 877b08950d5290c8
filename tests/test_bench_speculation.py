"""`llm-gateway bench speculation --quick`: both variants measured on every kind of prompt at
every concurrency, each in an engine of its own (what this asserts, never a speed figure:
docs/BENCHMARKS.md has those)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("aiohttp", reason="the bench extra is not installed")


@pytest.mark.own_engine  # two engines of the scenario's own: make test-all
def test_the_quick_speculation_scenario_measures_both_variants_on_every_kind(
    tmp_path: Path,
) -> None:
    from gateway_bench.speculation import KINDS, SCENARIO, VARIANTS, measure_variants

    options = SCENARIO.parse(["--quick", "--out", str(tmp_path)])
    runs = measure_variants(options)
    assert set(runs) == set(VARIANTS)
    keys = {f"{kind} c{c}" for kind in KINDS for c in options.concurrency}
    for name, (figures,) in runs.items():
        assert set(figures) == keys, name
        assert all(f["tok_s"] > 0 for f in figures.values()), name
    none, ngram = (runs[name][0] for name in VARIANTS)
    assert all(run[key]["tokens_per_step"] >= 1.0 for run in (none, ngram) for key in keys)
    # Where the answer repeats the prompt's code, drafts are accepted: more than a token a step.
    assert ngram["code-edit c1"]["tokens_per_step"] > none["code-edit c1"]["tokens_per_step"]
