"""`llm-gateway bench --scenario mixed --quick`: every target and regime measured, end to end.

The bench's own code path (its clients, the measure, the report) on the session's servers:
vLLM's own server, and two gateways on the shared engine, one with SCHEDULING_POLICY=fcfs (its
requests all of one class; the engine's scheduler stays the session's) and one with priorities.
Starting a server and an engine per target and regime, as the command does, would cost six
engine starts and check nothing more than that each part ran and reported: what this asserts,
never a speed figure (docs/BENCHMARKS.md has those).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from gateway.config.settings import served_model_name
from gateway_bench.targets import Endpoint
from serving import RunningServer, gateway_settings

pytest.importorskip("aiohttp", reason="the bench extra is not installed")


def test_the_quick_mixed_scenario_measures_every_target_in_both_regimes(
    tmp_path: Path, vllm_server: str, make_server: Callable[..., RunningServer]
) -> None:
    from gateway_bench.mixed import parse, run_mixed
    from gateway_bench.mixed_report import markdown

    options = parse(["--scenario", "mixed", "--quick", "--out", str(tmp_path)])
    served = served_model_name(gateway_settings().engine)
    urls = {
        "vllm-server": vllm_server,
        "gateway-fcfs": make_server(SCHEDULING_POLICY="fcfs").http,
        "gateway-priority": make_server(SCHEDULING_POLICY="priority").http,
    }
    asked: list[tuple[str, str]] = []

    @asynccontextmanager
    async def running(name: str, regime: str) -> AsyncIterator[Endpoint]:
        asked.append((name, regime))
        yield Endpoint(urls[name], model=served)

    run = run_mixed(options, "llm-gateway bench --scenario mixed --quick", running)
    report, out = asyncio.run(run)
    assert asked == [(name, regime) for regime in options.regimes for name in options.targets]
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
