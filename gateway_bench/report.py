"""The report: markdown (also printed), JSON, and the PNG chart (chart.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec

from gateway_bench.results import BenchReport, StepResult, TargetResult, table

MARKDOWN, JSON, CHART = "report.md", "report.json", "report.png"
_FIGURES: tuple[tuple[str, Callable[[StepResult], float | None]], ...] = (
    ("tok/s", lambda s: s.tokens_per_s),
    ("TTFT p50", lambda s: s.ttft_p50_ms),
    ("TTFT p99", lambda s: s.ttft_p99_ms),
    ("ITL p50", lambda s: s.itl_p50_ms),
    ("ITL p99", lambda s: s.itl_p99_ms),
    ("E2E p50", lambda s: s.e2e_p50_ms),
    ("E2E p99", lambda s: s.e2e_p99_ms),
)


def number_cell(value: float | None, digits: int = 1) -> str:
    """A figure as a table shows it: thousands separated, `-` for none."""
    return "-" if value is None else f"{value:,.{digits}f}"


def _ratio(value: float | None, reference: float | None) -> str:
    if value is None or not reference:
        return "-"
    return f"{value / reference:.2f}"


def _reference(targets: list[TargetResult], kind: str) -> dict[int, StepResult]:
    target = next((t for t in targets if t.kind == kind), None)
    return {} if target is None else {s.concurrency: s for s in target.steps}


def _figurestable(report: BenchReport) -> list[str]:
    ceiling = _reference(report.targets, "ceiling")
    header = ["target", "conc", "req", "err", "tokens", "tok/s", "÷ ceiling", "÷ vLLM"]
    header += ["TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "E2E p50", "E2E p99"]
    header += ["frontend CPU ms/token", "other CPU"]
    rows = []
    for target in report.targets:
        server = _reference(report.targets, target.compared_with)
        for s in target.steps:
            c, v = ceiling.get(s.concurrency), server.get(s.concurrency)
            rows.append(
                [
                    target.label,
                    str(s.concurrency),
                    str(s.requests),
                    str(s.errors),
                    f"{s.tokens}/{s.expected_tokens}",
                    number_cell(s.tokens_per_s),
                    _ratio(s.tokens_per_s, c.tokens_per_s if c else None),
                    _ratio(s.tokens_per_s, v.tokens_per_s if v else None),
                    number_cell(s.ttft_p50_ms),
                    number_cell(s.ttft_p99_ms),
                    number_cell(s.itl_p50_ms),
                    number_cell(s.itl_p99_ms),
                    number_cell(s.e2e_p50_ms, 0),
                    number_cell(s.e2e_p99_ms, 0),
                    number_cell(s.frontend_cpu_ms_per_token, 2),
                    "-" if s.other_cpu_pct is None else f"{s.other_cpu_pct:.0f}%",
                ]
            )
    return table(header, rows)


def _ratiostable(report: BenchReport) -> list[str]:
    ceiling = _reference(report.targets, "ceiling")
    rows = []
    for target in report.targets:
        server = _reference(report.targets, target.compared_with)
        for s in target.steps:
            c, v = ceiling.get(s.concurrency), server.get(s.concurrency)
            cells = [
                f"{_ratio(get(s), get(c) if c else None)} / {_ratio(get(s), get(v) if v else None)}"
                for _, get in _FIGURES
            ]
            rows.append([target.label, str(s.concurrency), *cells])
    return table(["target", "conc", *(name for name, _ in _FIGURES)], rows)


def _goals(report: BenchReport) -> list[str]:
    verdict = {True: "**pass**", False: "**FAIL**", None: "not measured"}
    rows = [[g.name, g.requirement, g.measured, verdict[g.passed]] for g in report.goals]
    return table(["goal", "requirement", "measured", "result"], rows)


def _continuation(report: BenchReport) -> list[str]:
    result = report.continuation
    if result is None:
        return ["Not measured."]
    rows = [
        [
            str(p.history_tokens),
            number_cell(p.continuation_ttft_ms),
            number_cell(p.fresh_ttft_ms),
            "-" if p.ratio is None else f"{p.ratio:.2f}",
            number_cell(p.resend_ttft_ms),
            str(p.repetitions),
            str(p.errors),
        ]
        for p in result.points
    ]
    header = ["history tokens", "continuation TTFT ms", "fresh TTFT ms", "ratio"]
    header += ["resend verbatim TTFT ms", "reps", "errors"]
    intro = (
        f"On {result.protocol}; each history is a prompt plus {result.generated_tokens} "
        f"generated tokens; each measured request generates {result.new_tokens}. Medians."
    )
    return [intro, "", *table(header, rows)]


def _connections(report: BenchReport) -> list[str]:
    c = report.connections
    if c is None:
        return ["Not measured."]
    rows = [
        ["idle WebSockets (/ws)", f"{c.idle_open} open of {c.idle_requested}"],
        ["errors while idle", str(c.idle_errors)],
        [
            "gateway RSS before / with them",
            f"{number_cell(c.rss_before_mb)} / {number_cell(c.rss_idle_mb)} MB",
        ],
        ["RSS per idle connection", f"{number_cell(c.kb_per_idle_connection)} KB"],
        ["concurrent streams", f"{c.streams} x {c.stream_output_tokens} tokens"],
        ["stream errors", str(c.stream_errors)],
        ["streams' tokens, wall time", f"{c.stream_tokens} in {c.stream_wall_s} s"],
        ["gateway RSS peak while streaming", f"{number_cell(c.rss_streaming_peak_mb)} MB"],
    ]
    if c.first_error:
        rows.append(["first error", c.first_error.replace("|", "/")])
    return table(["figure", "value"], rows)


def _targets(report: BenchReport) -> list[str]:
    rows = [
        [
            t.label,
            "-" if t.start_s is None else f"{t.start_s:.0f} s",
            str(t.warmup_errors),
            t.tokens,
            t.notes,
        ]
        for t in report.targets
    ]
    header = ["target", "start-up", "warm-up errors", "tokens", "how"]
    return table(header, rows)


def _errors(report: BenchReport) -> list[str]:
    seen = [
        f"- {t.label} at {s.concurrency}: {s.errors} errors, first: `{s.first_error}`"
        for t in report.targets
        for s in t.steps
        if s.first_error
    ]
    return ["## Errors", "", *seen, ""] if seen else []


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


def markdown(report: BenchReport, chart: str | None = CHART) -> str:
    m, e, w = report.machine, report.engine, report.workload
    packages = ", ".join(f"{k} {v}" for k, v in m.packages.items())
    prompt = (
        f"{w.prompt_tokens_min}"
        if w.prompt_tokens_min == w.prompt_tokens_max
        else f"{w.prompt_tokens_min}-{w.prompt_tokens_max}"
    )
    steps = ", ".join(f"{req} at {conc}" for conc, req in w.requests_per_step.items())
    lines = [
        "# llm-gateway bench" + (" (quick mode)" if report.quick else ""),
        "",
        f"`{report.command}`, started {report.started_at}, took {report.duration_s:.0f} s.",
        "",
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
        "",
        "## Targets",
        "",
        *_goals(report),
        "",
        "## Throughput and latency",
        "",
        "tok/s: output tokens per second of wall time. Latencies in ms, measured at the "
        "client: TTFT to the first text, ITL between text messages, E2E to the end. "
        "÷ ceiling and ÷ vLLM: this figure over the in-process ceiling's and vLLM's server's "
        "(on the same route: its chat row for the chat route, else streaming /v1/completions) "
        "at the same concurrency (above 1 is better for tok/s, below 1 for latencies). "
        "frontend CPU: CPU time of the serving process itself (the gateway, vLLM's API "
        "server; for the ceiling the bench process, its frontend and client), without vLLM's "
        "engine core, per generated token. other CPU: the share of the machine's CPU that "
        "processes other than the bench and the server under test used during the step; "
        "compare targets only where it is similar.",
        "",
        *_figurestable(report),
        "",
        "## Every figure as a ratio (÷ ceiling / ÷ vLLM server)",
        "",
        *_ratiostable(report),
        "",
    ]
    if chart:
        lines += [f"![throughput and TTFT against concurrency]({chart})", ""]
    lines += [
        "## Continuation by request_id",
        "",
        *_continuation(report),
        "",
        "## Connection scale",
        "",
        *_connections(report),
        "",
        "## How each target was measured",
        "",
        *_targets(report),
        "",
        *_errors(report),
    ]
    return "\n".join(lines)


def write(report: BenchReport, out: Path, chart_written: bool) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / MARKDOWN, out / JSON
    md.write_text(markdown(report, CHART if chart_written else None) + "\n")
    js.write_bytes(msgspec.json.format(msgspec.json.encode(report), indent=2) + b"\n")
    return md, js
