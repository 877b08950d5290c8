"""`llm-gateway bench constrained --quick` on the session's server: every variant at
every concurrency measured and reported, with its ratio to the unconstrained run (what this
asserts, never a speed figure: docs/BENCHMARKS.md has those)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from gateway.config.settings import served_model_name
from gateway_bench.targets import Endpoint
from serving import RunningServer, gateway_settings

pytest.importorskip("aiohttp", reason="the bench extra is not installed")


@pytest.mark.own_engine  # a bench scenario's quick run: make test-all
def test_the_quick_constrained_scenario_measures_every_variant(
    tmp_path: Path, server: RunningServer
) -> None:
    from gateway_bench.constrained import SCENARIO, VARIANTS, report, run_constrained

    options = SCENARIO.parse(["--quick", "--out", str(tmp_path)])
    served = served_model_name(gateway_settings().engine)

    @asynccontextmanager
    async def running() -> AsyncIterator[Endpoint]:
        yield Endpoint(server.http, model=served)

    result, out = asyncio.run(run_constrained(options, "bench --quick", running))
    measured = {(r.concurrency, r.variant) for r in result.rows}
    assert measured == {(c, v) for c in options.concurrency for v in VARIANTS}
    assert all(r.failed == 0 and r.tok_s > 0 and r.ratio is not None for r in result.rows)
    # Every answer is output_tokens long: no constraint lets an answer end sooner.
    each = options.output_tokens * options.rounds * options.repeats
    assert all(r.tokens == r.concurrency * each for r in result.rows)
    assert json.loads((out / "report.json").read_text())["rows"]
    text = report(result).markdown()
    assert "| 2 | json_schema |" in text and "x unconstrained" in text
    with pytest.raises(SystemExit):
        SCENARIO.parse(["--variants", "regex"])  # no baseline


def test_list_options_take_their_items_type() -> None:
    from gateway_bench.constrained import SCENARIO

    options = SCENARIO.parse(["--concurrency", "4", "32"])
    assert options.concurrency == [4, 32]


def test_each_ratio_is_taken_within_its_repeat_and_the_median_reported() -> None:
    from gateway_bench.results import StepResult
    from gateway_bench.runner import repeated

    rates = iter([100.0, 80.0, 50.0, 45.0, 200.0, 150.0])  # (base, other) per repeat, in turn

    async def measure(variant: str) -> StepResult:
        tok_s = next(rates)
        none = dict.fromkeys(["ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "e2e_p50_ms"])
        return StepResult(
            concurrency=1, requests=1, errors=0, tokens=1, expected_tokens=1, wall_s=1.0,
            tokens_per_s=tok_s, ttft_p50_ms=None, e2e_p99_ms=None, **none,
        )  # fmt: skip

    measured = asyncio.run(repeated(["base", "other"], 3, measure, {"other": "base"}.get))
    assert [s.tokens_per_s for s in measured["other"][0]] == [80.0, 45.0, 150.0]
    assert measured["other"][1] == 0.8  # the ratios 0.8, 0.9 and 0.75: their median
    assert measured["base"][1] is None
