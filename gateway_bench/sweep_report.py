"""The sweep's report (report.py's model): its settings, goals, figures, ratios, continuation,
connection scale and how each target was measured; and its PNG chart (chart.py)."""

from __future__ import annotations

from collections.abc import Callable

from gateway_bench.report import Report, Section, Table, cell, ratio
from gateway_bench.results import BenchReport, StepResult, TargetResult

CHART = "report.png"
_FIGURES: tuple[tuple[str, Callable[[StepResult], float | None]], ...] = (
    ("tok/s", lambda s: s.tokens_per_s),
    ("TTFT p50", lambda s: s.ttft_p50_ms),
    ("TTFT p99", lambda s: s.ttft_p99_ms),
    ("ITL p50", lambda s: s.itl_p50_ms),
    ("ITL p99", lambda s: s.itl_p99_ms),
    ("E2E p50", lambda s: s.e2e_p50_ms),
    ("E2E p99", lambda s: s.e2e_p99_ms),
)
_EXPLAINED = (
    "tok/s: output tokens per second of wall time. Latencies in ms, measured at the "
    "client: TTFT to the first text, ITL between text messages, E2E to the end. "
    "÷ ceiling and ÷ vLLM: this figure over the in-process ceiling's and vLLM's server's "
    "(on the same route: its chat row for the chat route, else streaming /v1/completions) "
    "at the same concurrency (above 1 is better for tok/s, below 1 for latencies). "
    "frontend CPU: CPU time of the serving process itself (the gateway, vLLM's API "
    "server; for the ceiling the bench process, its frontend and client), without vLLM's "
    "engine core, per generated token. other CPU: the share of the machine's CPU that "
    "processes other than the bench and the server under test used during the step; "
    "compare targets only where it is similar."
)


def _steps(targets: list[TargetResult], kind: str) -> dict[int, StepResult]:
    target = next((t for t in targets if t.kind == kind), None)
    return {} if target is None else {s.concurrency: s for s in target.steps}


def _pairs(
    report: BenchReport,
) -> list[tuple[TargetResult, StepResult, StepResult | None, StepResult | None]]:
    """Each step with the ceiling's and the vLLM server's (same route) at its concurrency."""
    ceiling = _steps(report.targets, "ceiling")
    found: list[tuple[TargetResult, StepResult, StepResult | None, StepResult | None]] = []
    for target in report.targets:
        server = _steps(report.targets, target.compared_with)
        for s in target.steps:
            found.append((target, s, ceiling.get(s.concurrency), server.get(s.concurrency)))
    return found


def _figures(report: BenchReport) -> Table:
    columns = ["target", "conc", "req", "err", "tokens", "tok/s", "÷ ceiling", "÷ vLLM"]
    columns += ["TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "E2E p50", "E2E p99"]
    table = Table([*columns, "frontend CPU ms/token", "other CPU"])
    for target, s, c, v in _pairs(report):
        table.rows.append(
            [target.label, s.concurrency, s.requests, s.errors, f"{s.tokens}/{s.expected_tokens}"]
            + [cell(s.tokens_per_s), ratio(s.tokens_per_s, c.tokens_per_s if c else None)]
            + [ratio(s.tokens_per_s, v.tokens_per_s if v else None)]
            + [cell(get(s), 0 if name.startswith("E2E") else 1) for name, get in _FIGURES[1:]]
            + [cell(s.frontend_cpu_ms_per_token, 2)]
            + ["-" if s.other_cpu_pct is None else f"{s.other_cpu_pct:.0f}%"]
        )
    return table


def _ratios(report: BenchReport) -> Table:
    table = Table(["target", "conc", *(name for name, _ in _FIGURES)])
    for target, s, c, v in _pairs(report):
        cells = [
            f"{ratio(get(s), get(c) if c else None)} / {ratio(get(s), get(v) if v else None)}"
            for _, get in _FIGURES
        ]
        table.rows.append([target.label, s.concurrency, *cells])
    return table


def _continuation(report: BenchReport) -> Section:
    result = report.continuation
    if result is None:
        return Section("Continuation by request_id", ["Not measured."])
    columns = ["history tokens", "continuation TTFT ms", "fresh TTFT ms", "ratio"]
    table = Table([*columns, "resend verbatim TTFT ms", "reps", "errors"])
    for p in result.points:
        shown = "-" if p.ratio is None else f"{p.ratio:.2f}"
        ttft = [cell(p.continuation_ttft_ms), cell(p.fresh_ttft_ms), shown, cell(p.resend_ttft_ms)]
        table.rows.append([p.history_tokens, *ttft, p.repetitions, p.errors])
    intro = (
        f"On {result.protocol}; each history is a prompt plus {result.generated_tokens} "
        f"generated tokens; each measured request generates {result.new_tokens}. Medians."
    )
    return Section("Continuation by request_id", [intro], table)


def _connections(report: BenchReport) -> Section:
    c = report.connections
    if c is None:
        return Section("Connection scale", ["Not measured."])
    rss = f"{cell(c.rss_before_mb)} / {cell(c.rss_idle_mb)} MB"
    rows: list[list[object]] = [
        ["idle WebSockets (/ws)", f"{c.idle_open} open of {c.idle_requested}"],
        ["errors while idle", c.idle_errors],
        ["gateway RSS before / with them", rss],
        ["RSS per idle connection", f"{cell(c.kb_per_idle_connection)} KB"],
        ["concurrent streams", f"{c.streams} x {c.stream_output_tokens} tokens"],
        ["stream errors", c.stream_errors],
        ["streams' tokens, wall time", f"{c.stream_tokens} in {c.stream_wall_s} s"],
        ["gateway RSS peak while streaming", f"{cell(c.rss_streaming_peak_mb)} MB"],
    ]
    if c.first_error:
        rows.append(["first error", c.first_error.replace("|", "/")])
    return Section("Connection scale", table=Table(["figure", "value"], rows))


def _cpu(report: BenchReport) -> str:
    """The CPU's flags that decide the defaults, and what the defaults are here."""
    m, d = report.machine, report.machine.defaults
    has = [flag for flag, present in m.cpu_flags.items() if present]
    lacks = [flag for flag, present in m.cpu_flags.items() if not present]
    flags = ", ".join(has) or "none of " + ", ".join(m.cpu_flags)
    if has and lacks:
        flags += f" (not {', '.join(lacks)})"
    dtype = d.dtype if d.dtype == d.requested_dtype else f"{d.requested_dtype} -> {d.dtype}"
    env = ", ".join(f"{k}={v}" for k, v in d.environment.items()) or "none added"
    budget = f"{d.step_tokens} tokens" if d.step_tokens else "vLLM's own"
    return (
        f"- CPU flags: {flags}. Device {d.device}; dtype {dtype}: {d.dtype_reason}; vLLM "
        f"environment: {env}; a step's tokens: {budget}. These are the gateway's CPU defaults "
        "(gateway/engine/cpu_defaults.py), "
        "given to the ceiling and to vLLM's server, not to vLLM's server with its defaults."
    )


def _intro(report: BenchReport) -> list[str]:
    m, e, w = report.machine, report.engine, report.workload
    packages = ", ".join(f"{k} {v}" for k, v in m.packages.items())
    low, high = w.prompt_tokens_min, w.prompt_tokens_max
    prompt = f"{low}" if low == high else f"{low}-{high}"
    steps = ", ".join(f"{req} at {conc}" for conc, req in w.requests_per_step.items())
    return [
        f"- Started {report.started_at}, took {report.duration_s:.0f} s.",
        f"- Machine: {m.cpu}, {m.logical_cores} logical cores, {m.memory_gib} GiB; {m.system}; "
        f"Python {m.python}; {packages}. Load average (1 min) at the start: {m.load_start}.",
        _cpu(report),
        f"- Engine (every target): {e.model}, max_model_len {e.max_model_len}, KV cache "
        f"{e.kv_cache_gib} GiB, {'eager' if e.enforce_eager else 'torch.compile'}, prefix "
        f"caching {'on' if e.enable_prefix_caching else 'off'}, dtype {e.dtype} "
        f"({m.defaults.dtype} here).",
        f"- Workload: seed {w.seed}, prompts of {prompt} tokens"
        f"{'' if w.exact_prompt_lengths else ' (approximate)'}, {w.output_tokens} output tokens "
        f"(ignore_eos, greedy), requests per step: {steps}.",
    ]


def sweep_report(report: BenchReport, chart: str | None = CHART) -> Report:
    how = Table(["target", "start-up", "warm-up errors", "tokens", "how"])
    for t in report.targets:
        start = "-" if t.start_s is None else f"{t.start_s:.0f} s"
        how.rows.append([t.label, start, t.warmup_errors, t.tokens, t.notes])
    errors = [
        f"- {t.label} at {s.concurrency}: {s.errors} errors, first: `{s.first_error}`"
        for t in report.targets
        for s in t.steps
        if s.first_error
    ]
    sections = [
        Section("Targets", goals=report.goals),
        Section("Throughput and latency", [_EXPLAINED], _figures(report)),
        Section("Every figure as a ratio (÷ ceiling / ÷ vLLM server)", table=_ratios(report)),
        Section(text=[f"![throughput and TTFT against concurrency]({chart})"] if chart else []),
        _continuation(report),
        _connections(report),
        Section("How each target was measured", table=how),
        *([Section("Errors", errors)] if errors else []),
    ]
    title = "llm-gateway bench" + (" (quick mode)" if report.quick else "")
    return Report(title, report.command, report.machine, sections, _intro(report))
