"""`llm-gateway bench --scenario mixed --quick`: every target and regime measured, end to end.

It asserts that each part ran and reported, never a speed figure (docs/BENCHMARKS.md has those).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

pytest.importorskip("aiohttp", reason="the bench extra is not installed")

# Starts its own servers and engines: not in `make test-fast`.
pytestmark = pytest.mark.engine


def test_the_quick_mixed_scenario_measures_every_target_in_both_regimes(tmp_path: Path) -> None:
    from gateway_bench.mixed import parse, run_mixed
    from gateway_bench.mixed_report import markdown

    options = parse(["--scenario", "mixed", "--quick", "--out", str(tmp_path)])
    report, out = asyncio.run(run_mixed(options, "llm-gateway bench --scenario mixed --quick"))
    assert [r.regime for r in report.regimes] == ["saturation", "overload"]
    for regime in report.regimes:
        names = [t.target for t in regime.targets]
        assert names == ["vllm-server", "gateway-fcfs", "gateway-priority"]
        for target in regime.targets:
            assert (target.interactive_failed, target.batch_failed) == (0, 0)
            assert len(target.series) == options.chat_requests
            assert target.idle_ttft_p50_ms is not None and target.batch_tok_s > 0
    saved = json.loads((out / "report.json").read_text())
    assert saved["command"].endswith("--quick")
    assert (out / "ttft.png").stat().st_size > 0
    assert "## overload" in markdown(report)
