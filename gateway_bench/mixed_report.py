"""The mixed scenario's figures: per regime and target, and the ratios between targets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from gateway_bench.metrics import percentile
from gateway_bench.results import Machine


class TargetResult(msgspec.Struct, kw_only=True):
    target: str
    idle_ttft_p50_ms: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    batch_tok_s: float
    interactive_failed: int
    batch_failed: int = 0
    series: list[tuple[float, float]]  # (seconds into the load, TTFT in seconds)

    @classmethod
    def of(
        cls,
        target: str,
        *,
        idle_ttft: list[float],
        loaded_ttft: list[float],
        series: list[tuple[float, float]],
        batch_tok_s: float,
        interactive_failed: int,
        batch_failed: int,
    ) -> TargetResult:
        return cls(
            target=target,
            idle_ttft_p50_ms=_ms(percentile(idle_ttft, 50)),
            ttft_p50_ms=_ms(percentile(loaded_ttft, 50)),
            ttft_p99_ms=_ms(percentile(loaded_ttft, 99)),
            batch_tok_s=round(batch_tok_s, 1),
            interactive_failed=interactive_failed,
            batch_failed=batch_failed,
            series=series,
        )

    @property
    def to_idle(self) -> float | None:
        return _ratio(self.ttft_p50_ms, self.idle_ttft_p50_ms)


class RegimeResult(msgspec.Struct):
    regime: str
    targets: list[TargetResult]

    def get(self, name: str) -> TargetResult | None:
        return next((t for t in self.targets if t.target == name), None)


class MixedReport(msgspec.Struct, kw_only=True):
    command: str
    machine: Machine
    options: Any  # MixedOptions (a Struct of its own module: kept loose to avoid a cycle)
    regimes: list[RegimeResult]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 2)


def _fmt(value: float | None, suffix: str = "") -> str:
    return "-" if value is None else f"{value:g}{suffix}"


def goals(regime: RegimeResult) -> list[tuple[str, bool | None]]:
    """Issue 15's goals for this regime; None where a figure is missing."""
    priority, fcfs, vllm = (
        regime.get(n) for n in ("gateway-priority", "gateway-fcfs", "vllm-server")
    )
    if priority is None:
        return []
    checks: list[tuple[str, bool | None]] = []
    to_idle = priority.to_idle
    checks.append(("interactive TTFT p50 <= 2x idle", None if to_idle is None else to_idle <= 2))
    if vllm is not None:
        to_vllm = _ratio(priority.ttft_p50_ms, vllm.ttft_p50_ms)
        verdict = None if to_vllm is None else to_vllm <= 0.3
        checks.append(("interactive TTFT p50 <= 0.3x vLLM's server", verdict))
    if fcfs is not None and fcfs.batch_tok_s:
        kept = priority.batch_tok_s / fcfs.batch_tok_s
        checks.append(("batch tok/s >= 0.95x the FCFS gateway", kept >= 0.95))
    return checks


def markdown(report: MixedReport) -> str:
    lines = [
        f"# {report.command}",
        "",
        report.machine.summary,
        "",
    ]
    for regime in report.regimes:
        fcfs, vllm = regime.get("gateway-fcfs"), regime.get("vllm-server")
        lines += [
            f"## {regime.regime}",
            "",
            "| target | idle TTFT p50 | TTFT p50 | TTFT p99 | p50 / idle | p50 / vLLM's"
            " | batch tok/s | batch / FCFS gateway | failed (chat, batch) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for t in regime.targets:
            to_vllm = _ratio(t.ttft_p50_ms, vllm.ttft_p50_ms) if vllm else None
            to_fcfs = _ratio(t.batch_tok_s, fcfs.batch_tok_s) if fcfs else None
            lines.append(
                f"| {t.target} | {_fmt(t.idle_ttft_p50_ms, ' ms')} | {_fmt(t.ttft_p50_ms, ' ms')}"
                f" | {_fmt(t.ttft_p99_ms, ' ms')} | {_fmt(t.to_idle, 'x')} | {_fmt(to_vllm, 'x')}"
                f" | {t.batch_tok_s:g} | {_fmt(to_fcfs, 'x')}"
                f" | {t.interactive_failed}, {t.batch_failed} |"
            )
        lines.append("")
        for name, met in goals(regime):
            verdict = "not measured" if met is None else ("met" if met else "**not met**")
            lines.append(f"- {name}: {verdict}")
        lines.append("")
    return "\n".join(lines)


def write_report(report: MixedReport, out: Path) -> None:
    (out / "report.json").write_bytes(msgspec.json.format(msgspec.json.encode(report)))
    (out / "report.md").write_text(markdown(report) + "\n")
    draw(report, out / "ttft.png")


def draw(report: MixedReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = report.regimes
    figure, axes = plt.subplots(1, len(regimes), figsize=(6 * len(regimes), 4), squeeze=False)
    for axis, regime in zip(axes[0], regimes, strict=True):
        for t in regime.targets:
            if t.series:
                xs, ys = zip(*t.series, strict=True)
                axis.plot(xs, [y * 1000 for y in ys], marker=".", label=t.target)
        axis.set_title(f"interactive TTFT under batch load: {regime.regime}")
        axis.set_xlabel("seconds into the load")
        axis.set_ylabel("TTFT (ms)")
        axis.set_yscale("log")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
