"""The PNG charts: matplotlib's figure for a grid of axes, and the sweep's chart: output
tokens/s and TTFT p50 against concurrency, one line per target."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway_bench.results import BenchReport

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# The references are drawn dashed or dotted and on top, so the protocols' lines never hide them.
_STYLE: dict[str, dict[str, Any]] = {
    "ceiling": {"color": "black", "linestyle": "--", "linewidth": 2.0, "zorder": 5},
    "ceiling-logprobs": {"color": "black", "linestyle": ":", "linewidth": 1.5, "zorder": 5},
    "vllm-server": {"color": "grey", "linestyle": "--", "linewidth": 2.0, "zorder": 4},
    "vllm-server-logprobs": {"color": "grey", "linestyle": ":", "linewidth": 1.5, "zorder": 4},
    "vllm-server-defaults": {"color": "grey", "linestyle": "-.", "linewidth": 1.5, "zorder": 4},
    "vllm-server-chat": {"color": "black", "linestyle": "--", "linewidth": 1.5, "zorder": 4},
    "llama-cpp": {"color": "brown", "linestyle": "-.", "linewidth": 2.0, "zorder": 4},
}


def _minor_label(value: float, _: object) -> str:
    """Label only the 2s and 5s between powers of ten: more would overlap."""
    return f"{value:g}" if f"{value:g}"[0] in "25" else ""


def grid(rows: int, columns: int, size: tuple[float, float]) -> tuple[Figure, Any]:
    import matplotlib

    matplotlib.use("Agg")  # no display; must precede pyplot
    import matplotlib.pyplot as plt

    return plt.subplots(rows, columns, figsize=size, squeeze=False)


def save(figure: Figure, path: Path) -> None:
    import matplotlib.pyplot as plt

    figure.savefig(path, dpi=110)
    plt.close(figure)


def draw(report: BenchReport, path: Path) -> None:
    from matplotlib.ticker import FuncFormatter

    figure, axes = grid(1, 2, (13, 5.5))
    throughput, ttft = axes[0]
    for target in report.targets:
        steps = [s for s in target.steps if s.requests > s.errors]
        if not steps:
            continue
        x = [s.concurrency for s in steps]
        style = _STYLE.get(target.kind, {"linewidth": 1.2})
        throughput.plot(x, [s.tokens_per_s for s in steps], marker="o", label=target.label, **style)
        points = [(s.concurrency, s.ttft_p50_ms) for s in steps if s.ttft_p50_ms is not None]
        ttft.plot([p[0] for p in points], [p[1] for p in points], marker="o", **style)
    concurrencies = sorted({s.concurrency for t in report.targets for s in t.steps})
    for axis, title, unit in (
        (throughput, "Output tokens/s", "tokens/s"),
        (ttft, "TTFT p50", "ms"),
    ):
        axis.set_title(title)
        axis.set_xlabel("concurrency")
        axis.set_ylabel(unit)
        axis.set_xscale("log", base=2)
        if concurrencies:
            axis.set_xticks(concurrencies, [str(c) for c in concurrencies])
        axis.grid(True, alpha=0.3)
    ttft.set_yscale("log")
    ttft.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ttft.yaxis.set_minor_formatter(FuncFormatter(_minor_label))
    figure.legend(loc="lower center", ncol=3, fontsize="small", frameon=False)
    mode = " (quick mode)" if report.quick else ""
    figure.suptitle(
        f"llm-gateway bench{mode}: {report.engine.model}, {report.workload.output_tokens} "
        f"output tokens, {report.machine.logical_cores} cores"
    )
    figure.tight_layout(rect=(0, 0.12, 1, 1))
    save(figure, path)
