"""`llm-gateway bench --quick` on the session's engine and server: every target answers
without errors and the report is written. No speed figure and no wall-clock limit: the
machine's speed is what the bench measures, not what the test checks."""

from __future__ import annotations

import asyncio
import os
import struct
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import pytest

from gateway_bench import goals
from gateway_bench.metrics import Record, itl_samples, percentile, start
from gateway_bench.report import JSON, MARKDOWN, write
from gateway_bench.results import BenchReport, StepResult, TargetResult
from gateway_bench.scrape import metric_sums
from gateway_bench.soak import PROTOCOLS, keys_file, new_key, run_soak
from gateway_bench.soak import QUICK as QUICK_SOAK
from gateway_bench.soak import SCENARIO as SOAK
from gateway_bench.soak_report import Counters, Presence, Scrape, margins, soak_report
from gateway_bench.sweep import PROTOCOL_NAMES, QUICK, SCENARIO, run_benchmark
from gateway_bench.sweep_report import CHART
from gateway_bench.targets import Endpoint
from protocols.names import Protocol
from serving import LoopThread, RunningServer

# Starts its own servers and engines: not in `make test-fast`.
pytestmark = pytest.mark.engine

if TYPE_CHECKING:  # it imports vllm: not needed to collect the pure tests
    from gateway.engine.vllm_engine import VllmEngine

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SOAK_PROTOCOLS = list(PROTOCOLS)


@pytest.mark.own_engine  # a bench scenario's quick run: make test-all
@pytest.mark.timeout(0)  # no wall-clock limit: however slow the machine, the run completes
def test_quick_bench_measures_every_target_and_writes_the_report(
    loop_thread: LoopThread, engine: VllmEngine, server: RunningServer, tmp_path: Path
) -> None:
    options = msgspec.structs.replace(QUICK, vllm_server=False, out=str(tmp_path), progress=False)
    gateway = Endpoint(server.http, os.getpid())  # the test server runs in this process
    run = run_benchmark(options, engine=engine, gateway=gateway)
    report, out = asyncio.run_coroutine_threadsafe(run, loop_thread.loop).result()

    assert out == tmp_path
    assert [t.name for t in report.targets] == ["ceiling", "ceiling-logprobs", *PROTOCOL_NAMES]
    for target in report.targets:
        assert [s.concurrency for s in target.steps] == list(QUICK.concurrency), target.notes
        assert target.warmup_errors == 0, target.name
        for step in target.steps:
            assert step.errors == 0, (target.name, step.concurrency, step.first_error)
            assert step.tokens > 0 and step.tokens_per_s > 0, target.name
            assert step.ttft_p50_ms is not None and step.e2e_p99_ms is not None, target.name
            assert step.other_cpu_pct is not None, target.name
            assert step.frontend_cpu_ms_per_token is not None, target.name
            assert step.tokens == step.expected_tokens, target.name

    assert report.continuation is not None
    for point in report.continuation.points:
        assert point.errors == 0, point.first_error
        assert point.ratio is not None and point.resend_ttft_ms is not None
    connections = report.connections
    assert connections is not None
    assert connections.idle_errors == 0 and connections.stream_errors == 0, connections
    assert connections.idle_open == QUICK.idle_connections
    assert connections.stream_tokens == QUICK.streams * QUICK.stream_tokens
    assert connections.kb_per_idle_connection is not None
    assert {g.passed for g in report.goals} == {None}  # quick mode measures no target
    assert set(report.machine.cpu_flags) == {"avx2", "avx512f", "avx512_bf16", "amx_bf16"}
    assert report.machine.defaults.dtype and report.machine.defaults.dtype_reason

    written = msgspec.json.decode((tmp_path / JSON).read_bytes(), type=BenchReport)
    assert written == report
    text = (tmp_path / MARKDOWN).read_text()
    assert text.startswith("# llm-gateway bench (quick mode)")
    assert "- CPU flags: " in text and report.machine.defaults.dtype_reason in text
    assert f"a step's tokens: {report.machine.defaults.step_tokens} tokens" in text  # a CPU's
    for heading in ("## Targets", "## Throughput and latency", "## Continuation by request_id"):
        assert heading in text
    rows = [line for line in text.splitlines() if line.startswith("| WS /ws |")]
    assert len(rows) == 2 * len(QUICK.concurrency) + 1  # figures, ratios, how measured
    assert all(row.count("|") == rows[0].count("|") for row in rows[: len(QUICK.concurrency)])
    png = (tmp_path / CHART).read_bytes()
    assert png.startswith(PNG_MAGIC) and png[12:16] == b"IHDR"
    width, height = struct.unpack(">II", png[16:24])
    assert width > 500 and height > 300


def test_inter_token_latency_spreads_messages_over_their_tokens() -> None:
    # Counts known: a message carrying 2 tokens after 0.2 s gives two samples of 0.1 s.
    known = Record(0.0, first=1.0, end=1.5, arrivals=[1.0, 1.1, 1.3], counts=[1, 1, 2], tokens=4)
    assert itl_samples(known) == pytest.approx([0.1, 0.1, 0.1])
    # Counts unknown: 5 tokens after the first over 2 gaps, 2.5 tokens per message.
    unknown = Record(0.0, first=1.0, end=2.0, arrivals=[1.0, 1.5, 2.0], counts=[0, 0, 0], tokens=6)
    assert itl_samples(unknown) == pytest.approx([0.2, 0.2])
    # Counted reads: tokens that came without text go with the next text, or the last one.
    counted = start()
    for tokens, text in ((1, False), (1, True), (2, True), (1, False)):
        counted.counted(tokens, text)
    counted.finish_counted()
    assert counted.counts == [2, 3] and counted.tokens == 5
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0], 99) == pytest.approx(1.99)
    assert percentile([], 50) is None


def test_command_line_options() -> None:
    quick = SCENARIO.parse(["--quick", "--concurrency", "2,3", "--no-vllm-server"])
    assert quick.quick and quick.concurrency == (2, 3) and not quick.vllm_server
    assert quick.output_tokens == QUICK.output_tokens
    full = SCENARIO.parse(["--prompt-tokens", "100-200", "--protocols", "ws,lmi,tgi"])
    assert full.prompt_tokens == (100, 200)
    assert full.protocols == (Protocol.WS, Protocol.LMI, Protocol.TGI)
    assert full.concurrency == (1, 8, 32, 64) and full.output_tokens == 64
    assert full.vllm_server_defaults and full.dtype == "auto"
    assert not SCENARIO.parse(["--no-vllm-server-defaults"]).vllm_server_defaults
    # The gateway's protocol names, protocols.names.Protocol's values.
    assert set(PROTOCOL_NAMES) <= set(Protocol)
    with pytest.raises(SystemExit):
        SCENARIO.parse(["--protocols", "carrier-pigeon"])
    with pytest.raises(SystemExit):
        SCENARIO.parse(["--protocols", "invocations"])  # the bench's name before protocols.names


def _target(
    name: str,
    kind: str,
    tok_s: float,
    ttft: float,
    logprobs: bool = False,
    compared_with: str = "vllm-server",
) -> TargetResult:
    step = StepResult(
        concurrency=32,
        requests=64,
        errors=0,
        tokens=4096,
        expected_tokens=4096,
        wall_s=4096 / tok_s,
        tokens_per_s=tok_s,
        ttft_p50_ms=ttft,
        ttft_p99_ms=ttft,
        itl_p50_ms=50.0,
        itl_p99_ms=80.0,
        e2e_p50_ms=4000.0,
        e2e_p99_ms=5000.0,
    )
    return TargetResult(
        name=name,
        label=name,
        kind=kind,  # type: ignore[arg-type]
        tokens="counted",
        notes="",
        steps=[step],
        logprobs=logprobs,
        compared_with=compared_with,  # type: ignore[arg-type]
    )


def test_protocol_goals_compare_with_the_ceiling_and_vllm_at_32() -> None:
    references = [
        _target("ceiling", "ceiling", 440.0, 800.0),
        _target("ceiling-logprobs", "ceiling-logprobs", 400.0, 820.0),
        _target("vllm-server", "vllm-server", 420.0, 820.0),
        _target("vllm-server-logprobs", "vllm-server-logprobs", 380.0, 850.0),
    ]
    protocols = [
        _target("fast", "gateway", 430.0, 810.0),  # 0.98 x ceiling, above vLLM, earlier TTFT
        _target("late", "gateway", 430.0, 830.0),  # TTFT above vLLM's server's
        _target("slow", "gateway", 410.0, 700.0),  # 0.93 x ceiling
        _target("lmi", "gateway", 404.0, 700.0, logprobs=True),
    ]
    judged = goals.evaluate([*references, *protocols], None, None, 64)
    by_name = {g.name.removesuffix(" throughput and TTFT"): g for g in judged}
    assert [by_name[n].passed for n in ("fast", "late", "slow", "lmi")] == [
        True,
        False,
        False,
        False,
    ]
    assert "1.01 x the ceiling with logprobs=0" in by_name["lmi"].measured
    assert "1.06 x vLLM with logprobs=0, TTFT p50 700.0 vs 850.0 ms" in by_name["lmi"].measured
    assert "logprobs=0" not in by_name["slow"].measured
    assert goals.evaluate([*references, *protocols], None, None, 8)[0].passed is None
    # The thresholds are the GOALS table's: a stricter table fails the "fast" protocol too.
    stricter = tuple(
        replace(g, ceiling_share=0.99) if isinstance(g, goals.ProtocolGoal) else g
        for g in goals.GOALS
    )
    fast = goals.evaluate([*references, protocols[0]], None, None, 64, stricter)[0]
    assert fast.passed is False and "0.99 x ceiling" in fast.requirement
    names = [g.name for g in goals.evaluate([], None, None, 64)]
    assert names == ["Continuation by request_id", "Idle WebSocket memory", "Concurrent streams"]


def test_the_chat_route_is_judged_against_vllms_chat_route() -> None:
    references = [
        _target("ceiling", "ceiling", 440.0, 800.0),
        _target("vllm-server", "vllm-server", 420.0, 700.0),
        _target("vllm-server-chat", "vllm-server-chat", 400.0, 900.0),
    ]
    chat = _target("chat", "gateway", 425.0, 850.0, compared_with="vllm-server-chat")
    [judged] = [g for g in goals.evaluate([*references, chat], None, None, 64) if "chat" in g.name]
    assert judged.passed is True  # above vLLM's chat route, below its TTFT (not /v1/completions')
    assert "1.06 x vLLM; TTFT p50 850.0 vs 900.0 ms" in judged.measured


@pytest.mark.own_engine  # a bench scenario's quick run: make test-all
@pytest.mark.timeout(0)  # no wall-clock limit: however slow the machine, the run completes
def test_quick_soak_ends_every_prompt_once(
    engine: VllmEngine, make_server: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """`llm-gateway bench soak --quick` on a keyed server of the shared engine: no
    5xx, every prompt whose client stayed ends once at the clients, accepted = terminal in
    /metrics and the engine idle at the end (no speed, memory or timing figure)."""
    keys, amplifier = (new_key(), new_key()), new_key()
    keys_path = tmp_path / "api-keys"
    keys_path.write_text(keys_file(*keys, QUICK_SOAK, amplifier))
    server = make_server(API_KEYS_FILE=str(keys_path))
    options = msgspec.structs.replace(QUICK_SOAK, out=str(tmp_path), progress=False)
    run = run_soak(
        options,
        base_url=server.http,
        keys=keys,
        pid=os.getpid(),
        tokenizer=engine.tokenizer,
        amplifier=amplifier,
    )
    report = asyncio.run(run)  # the clients on a loop of their own; the server runs on its own

    clients, server_counts = report.clients, report.server
    assert clients.requests == QUICK_SOAK.requests
    assert set(clients.by_protocol) == set(SOAK_PROTOCOLS)
    assert clients.left > 0 and clients.invalid > 0 and clients.by_key["limited"] > 0
    assert clients.status_5xx == 0 and clients.cut == 0 and clients.duplicated == 0
    assert clients.unexpected == 0, clients.first_unexpected
    assert clients.invalid_refused == clients.invalid
    assert server_counts.accepted == server_counts.terminal_total, server_counts
    assert server_counts.engine_requests == 0
    goals = {goal.name: goal for goal in report.goals}
    for name in (
        "No server error",
        "One terminal per prompt, at the clients",
        "One terminal per prompt, in /metrics",
    ):
        assert goals[name].passed, goals[name].measured
    amplification = report.amplification
    assert amplification is not None and amplification.sequences == 2
    assert (amplification.server_errors, amplification.chat_failures) == (0, 0)
    assert amplification.asks_finished > 0 and amplification.over_asks > 0
    assert amplification.over_asks >= 2  # each asker's first: `n`, then `num_beams`
    assert amplification.over_refused_naming_field == amplification.over_asks
    assert amplification.idle_ttft_p50_ms and amplification.contended_ttft_p50_ms
    assert goals["No amplification by sequences"].passed is None  # quick: a ratio of chance
    constraints = amplification.constraints  # the probe's shapes, each refused naming its limit
    assert constraints is not None and constraints.probes > 0, constraints
    assert constraints.refused_naming_field == constraints.probes, constraints
    assert (constraints.server_errors, constraints.chat_failures) == (0, 0)
    assert constraints.contended_ttft_p50_ms and amplification.constraint_ratio
    assert goals["No amplification by constraints"].passed is None
    write(report, soak_report(report), tmp_path, "soak")
    assert (tmp_path / "soak.md").read_text().startswith("# llm-gateway bench soak")


def test_soak_command_line_and_scenario() -> None:
    quick = SOAK.parse(["--quick", "--requests", "50"])
    assert quick.quick and quick.requests == 50 and quick.concurrency == QUICK_SOAK.concurrency
    full = SOAK.parse([])
    assert (full.requests, full.concurrency, full.output_tokens) == (10_000, 64, (8, 16))
    assert (full.leave_share, full.invalid_share) == (0.10, 0.05)
    assert SCENARIO.parse(["--quick"]).quick
    with pytest.raises(SystemExit):
        SOAK.parse(["--gateway-url", "http://127.0.0.1:1"])  # its keys are needed too
    with pytest.raises(SystemExit):
        SOAK.parse(["--limited-clients", "64"])


def test_engine_requests_are_explained_by_clients_present() -> None:
    # Two clients: one answered at 2.0, one that left at 1.0 (present until 2.0 with the grace).
    presences = [Presence(0.0, 2.0, 1), Presence(0.5, 2.0, 1)]
    scrapes = [
        Scrape(1.0, 1.1, 2),  # both present
        Scrape(2.5, 2.6, 1),  # nobody present: a request outlived its client
        Scrape(1.9, 2.1, 2),  # both present at the scrape's start
        Scrape(0.1, 0.2, 2),  # only the first had started
    ]
    found = margins(scrapes, presences)
    assert [s for s, m in zip(scrapes, found, strict=True) if m < 0] == [scrapes[1], scrapes[3]]
    assert found == [0, -1, 0, -1]
    text = "\n".join(
        [
            'gateway_prompts_accepted_total{protocol="ws"} 3.0',
            'gateway_prompts_accepted_total{protocol="lmi"} 2.0',
            'gateway_terminal_events_total{kind="finished",protocol="ws"} 2.0',
            'gateway_terminal_events_total{kind="client_gone",protocol="lmi"} 2.0',
            'gateway_terminal_events_total{kind="finished",protocol="lmi"} 0.0',
            'gateway_engine_aborts_total{protocol="lmi"} 2.0',
            "gateway_engine_requests 1.0",
        ]
    )
    counters = Counters.of(metric_sums(text + "\n"))
    assert counters.accepted == 5 and counters.terminal == {"client_gone": 2, "finished": 2}
    assert (counters.engine_aborts, counters.engine_requests, counters.terminal_total) == (2, 1, 4)
