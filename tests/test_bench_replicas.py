"""`llm-gateway bench replicas --quick`: each target measured.

The in-process engine (the session's own server: an engine in-process, on the tests'
settings) and one Ray replica (throughput), then two replicas routed by continuation key and
by load (continuation): each replica target a gateway of its own, started and stopped, its
replicas created on the session's Ray cluster (`--ray-address`) and removed after it.
It asserts that each part ran and reported, never a speed figure (docs/BENCHMARKS.md has
those); with one repetition even the cache-hit share under load routing is chance.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from serving import RunningServer

pytest.importorskip("aiohttp", reason="the bench extra is not installed")
pytest.importorskip("ray", reason="the ray extra is not installed")
# Starts three gateways and their replicas: not in `make test-fast`.
pytestmark = [pytest.mark.timeout(1800), pytest.mark.engine]


def test_the_quick_replicas_scenario_measures_every_target(
    tmp_path: Path, server: RunningServer, ray_address: str
) -> None:
    from gateway_bench.replica_bench import SCENARIO, report_of, run_replicas

    argv = ["--quick", "--out", str(tmp_path)]
    options = SCENARIO.parse([*argv, "--ray-address", ray_address])
    command = "llm-gateway bench replicas --quick"
    report = asyncio.run(run_replicas(options, command, in_process_url=server.http))
    assert [t.target for t in report.throughput] == ["in-process", "one-replica"]
    assert all(t.failed == 0 and t.tok_s > 0 for t in report.throughput)
    assert all(t.ttft_p50_ms is not None and t.ttft_p50_ms > 0 for t in report.throughput)
    assert [c.routing for c in report.continuation] == ["affinity", "load"]
    for result in report.continuation:
        assert (result.failed, result.measured) == (0, options.repetitions)
        assert result.continuation_ttft_ms is not None and result.fresh_ttft_ms is not None
    affinity = report.continuation[0]
    assert affinity.from_cache == affinity.measured  # its own replica: the blocks are there
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["command"].endswith("--quick")
    assert "continuation / fresh" in report_of(report).markdown()


def test_the_report_gives_each_pair_its_ratio_and_their_median() -> None:
    from gateway_bench import machine
    from gateway_bench.replica_bench import ReplicaOptions, ReplicaReport, Throughput, report_of

    pairs = [("in-process", 200.0), ("one-replica", 180.0), ("in-process", 250.0)]
    pairs += [("one-replica", 200.0), ("in-process", 100.0), ("one-replica", 95.0)]
    report = ReplicaReport(
        command="llm-gateway bench replicas --repeats 3",
        machine=machine.describe("auto"),
        options=ReplicaOptions(repeats=3),
        throughput=[Throughput(target, tok_s, 0) for target, tok_s in pairs],
        continuation=[],
    )
    report.throughput[1].ttft_p50_ms, report.throughput[1].itl_p50_ms = 2490.04, 90.12
    text = report_of(report).markdown()
    assert "| one-replica | 180.0 | 0.90x | 2,490.0 | 90.1 | 0 |" in text  # within its own pair
    assert "| one-replica | 200.0 | 0.80x | - | - | 0 |" in text
    assert "median of 3 pairs: **0.90x** (from 0.80 to 0.95)" in text
