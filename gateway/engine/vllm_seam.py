"""Every vLLM internal the gateway relies on, each behind one small function or class.

vLLM's public API (`AsyncLLM`, `SamplingParams`, the `scheduler_cls` and `stat_loggers` hooks)
does not reach all the gateway does: the bulk cap's scheduler decides what a step takes, which
vLLM's scheduler decides inside `schedule()` with no hook; the engine's death is one task's
end, and the engine-core processes are only in the client's internals; the scheduler's counts
come in stats classes vLLM calls unstable. Each use of an underscore name or of an internal
attribute layout is here, with why no public API serves, and the other modules call these:
`make lint` refuses a private vLLM name anywhere else (tests/private_names.py).

`TOUCHPOINTS` lists the vLLM names each one relies on; tests/test_vllm_contract.py checks them
against the installed vLLM without starting an engine, the first step of an upgrade
(docs/ARCHITECTURE.md, "The seam to vLLM"). This module imports only vLLM and the standard
library, so that check runs in any environment that has vLLM.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

from vllm.config import VllmConfig
from vllm.outputs import RequestOutput
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.metrics.loggers import StatLoggerBase
from vllm.v1.metrics.stats import IterationStats, RequestStateStats, SchedulerStats
from vllm.v1.request import Request, RequestStatus

__all__ = ["Request", "RequestStatus", "SchedulerOutput"]


@dataclass(frozen=True)
class Use:
    """One vLLM name a touchpoint relies on: a method of `owner` ("module:Class") that takes
    `parameters` (in this order, after self), or with `parameters` None an attribute each
    instance of `owner` has (set in its `__init__`, a field, or a class attribute)."""

    owner: str
    name: str
    parameters: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Touchpoint:
    seam: str  # the function or class of this module
    uses: tuple[Use, ...]


SCHEDULER = "vllm.v1.core.sched.scheduler:Scheduler"
QUEUE = "vllm.v1.core.sched.request_queue:RequestQueue"
REQUEST = "vllm.v1.request:Request"
ASYNC_LLM = "vllm.v1.engine.async_llm:AsyncLLM"
STAT_LOGGER = "vllm.v1.metrics.loggers:StatLoggerBase"


# --- The bulk cap's scheduler (gateway/engine/bulk_scheduler.py) -----------------------------
# vLLM loads a subclass of its Scheduler from `scheduler_cls`, but which running and waiting
# requests a step takes, and its token budget, are decided inside `schedule()`: no hook or
# parameter says "leave these out of this step". The cap hides requests from the scheduler's
# own queues for one step and bounds the budget attribute `schedule()` reads.


class StepScheduler(Scheduler):
    """vLLM's scheduler with its step wrapped: a subclass overrides `step` (given vLLM's own
    step as `schedule`) and `waiting_in_running` (requests of the running list that the
    engine's stats should count as waiting), instead of vLLM's methods."""

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        return self.step(partial(super().schedule, throttle_prefills))

    def step(self, schedule: Callable[[], SchedulerOutput]) -> SchedulerOutput:
        return schedule()

    def get_request_counts(self) -> tuple[int, int]:
        running, waiting = super().get_request_counts()
        moved = self.waiting_in_running()
        return running - moved, waiting + moved

    def waiting_in_running(self) -> int:
        return 0


def engine_config(scheduler: Scheduler) -> VllmConfig:
    """The engine's configuration (`additional_config` carries the gateway's settings): vLLM
    hands it to the scheduler's constructor only, which keeps it as an attribute."""
    config: VllmConfig = scheduler.vllm_config
    return config


def running(scheduler: Scheduler) -> Sequence[Request]:
    """The running requests, in the scheduler's order (its internal list: read, not changed)."""
    return scheduler.running


def waiting(scheduler: Scheduler) -> Iterable[Request]:
    """The waiting queue, in its policy's order (what `left_out` can hold back)."""
    return scheduler.waiting


def kv_holding_waiting(scheduler: Scheduler) -> Iterable[Request]:
    """Waiting requests that hold KV blocks (a queue vLLM drains before `waiting`)."""
    return scheduler.kv_holding_waiting


@contextmanager
def left_out(
    scheduler: Scheduler, paused: Iterable[Request], held: Iterable[Request]
) -> Iterator[None]:
    """Within the block, `paused` (running) and `held` (waiting) are not in the scheduler's
    queues, so a step cannot take them; after it they are back, `paused` at the running list's
    end (a paused request keeps its KV blocks and its status)."""
    paused, held = list(paused), list(held)
    out = {r.request_id for r in paused}
    scheduler.running = [r for r in scheduler.running if r.request_id not in out]
    scheduler.waiting.remove_requests(held)
    try:
        yield
    finally:
        for request in held:
            scheduler.waiting.add_request(request)
        scheduler.running.extend(paused)


def preempt(scheduler: Scheduler, request: Request, now: float) -> None:
    """Preempts a running request as vLLM does when the KV cache is full (its blocks freed, back
    to the waiting queue's front): vLLM preempts only from inside its own step."""
    scheduler.running.remove(request)
    scheduler._preempt_request(request, now)


@contextmanager
def step_tokens_at_most(scheduler: Scheduler, tokens: int) -> Iterator[None]:
    """Within the block a step computes at most `tokens` tokens (0: vLLM's budget): the budget
    is an attribute `schedule()` reads, set once from the engine's settings."""
    budget = scheduler.max_num_scheduled_tokens
    if tokens:
        scheduler.max_num_scheduled_tokens = min(budget, tokens)
    try:
        yield
    finally:
        scheduler.max_num_scheduled_tokens = budget


# --- The engine's life (gateway/engine/death_watch.py) ----------------------------------------


def start_output_handler(llm: AsyncLLM) -> asyncio.Task[Any]:
    """Starts AsyncLLM's output handler now (vLLM starts it with the first request, or when
    built on a running loop) and returns its task, whose end is the engine's death: vLLM has no
    public death callback, and `errored` can only be polled."""
    engine: Any = llm  # a private method, untyped
    engine._run_output_handler()
    handler: asyncio.Task[Any] | None = llm.output_handler
    assert handler is not None
    return handler


def core_processes(llm: AsyncLLM) -> list[BaseProcess]:
    """vLLM's engine-core processes (none when the engine core runs in this process): only
    the multiprocess client's background resources know them."""
    resources = getattr(llm.engine_core, "resources", None)
    manager = getattr(resources, "engine_manager", None)
    return list(getattr(manager, "processes", []))


class SchedulerCounts(Protocol):
    preemptions: int
    running: int
    waiting: int


class SchedulerStatsLogger(StatLoggerBase):
    """Keeps `counts` current from vLLM's per-step stats (`AsyncLLM(stat_loggers=...)`, with
    `functools.partial(SchedulerStatsLogger, counts)`). The hook is public, but vLLM calls the
    stats classes it hands over unstable: the fields read are listed in TOUCHPOINTS."""

    def __init__(self, counts: SchedulerCounts, vllm_config: Any, engine_index: int = 0) -> None:
        self.counts = counts

    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        if iteration_stats is not None:
            self.counts.preemptions += iteration_stats.num_preempted_reqs
        if scheduler_stats is not None:
            self.counts.running = scheduler_stats.num_running_reqs
            self.counts.waiting = scheduler_stats.num_waiting_reqs

    def log_engine_initialized(self) -> None:
        pass


# --- Seeded sampling across a chunked prefill on CPU (gateway/engine/seeded_cpu_worker.py) --
# A prompt longer than a step is prefilled in chunks; each chunk samples a token that is then
# discarded, and vLLM's model runner rewinds the request's generator with `set_offset`, which a
# CPU generator refuses ("CPU Generator does not use offset"): the worker dies, and with it the
# engine, on any seeded request longer than a step. No setting or hook reaches this. Here the
# sampler draws a discarded row from a copy of its generator, so the request's own is untouched
# (what the rewind achieves on CUDA), and the rewind is skipped for those rows.
RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"


def keep_discarded_draws_off_cpu_generators() -> None:
    """Patch vLLM's model runner, in the worker process that loads it, as described above.
    Rows on other devices keep vLLM's own rewind. Applying it twice is harmless."""
    import numpy
    import torch
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if getattr(GPUModelRunner, "_gateway_cpu_draws", False):
        return
    sample, bookkeeping = GPUModelRunner._sample, GPUModelRunner._bookkeeping_sync

    def discarded_cpu_rows(runner: Any) -> list[int]:
        rows = numpy.nonzero(runner.discard_request_mask.np[: runner.input_batch.num_reqs])[0]
        generators = runner.input_batch.generators
        return [
            int(row)
            for row in rows
            if int(row) in generators and generators[int(row)].device.type == "cpu"
        ]

    def sample_from_copies(runner: Any, *args: Any, **kwargs: Any) -> Any:
        generators = runner.input_batch.generators
        own = {row: generators[row] for row in discarded_cpu_rows(runner)}
        for row, generator in own.items():
            copy = torch.Generator(device="cpu")
            copy.set_state(generator.get_state())
            generators[row] = copy
        try:
            return sample(runner, *args, **kwargs)
        finally:
            generators.update(own)

    def bookkeeping_without_cpu_rewind(runner: Any, *args: Any, **kwargs: Any) -> Any:
        generators = runner.input_batch.generators
        untouched = {row: generators.pop(row) for row in discarded_cpu_rows(runner)}
        try:
            return bookkeeping(runner, *args, **kwargs)
        finally:
            generators.update(untouched)

    GPUModelRunner._sample = sample_from_copies  # type: ignore[method-assign,assignment]
    GPUModelRunner._bookkeeping_sync = bookkeeping_without_cpu_rewind  # type: ignore[method-assign,assignment]
    GPUModelRunner._gateway_cpu_draws = True  # type: ignore[attr-defined]


def discarded_draws_kept_off_cpu_generators() -> bool:
    """Whether this process's model runner has the patch above."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return GPUModelRunner._sample.__name__ == "sample_from_copies"


# --- Masks that allow every token (issue 46: `auto` tools) ----------------------------------
# vLLM's model runner applies each constrained request's token bitmask to its logits every
# step, even where the grammar allows every token (a structural tag's free text: `auto` tools
# before the call marker), and on CPU it converts the batch's logits to float32 and back to do
# so: 2-3 ms a step at 32 requests of a 49k vocabulary, most of what a grammar costs a step in
# free text (filling the masks takes microseconds). xgrammar says when a mask needs no
# applying, but vLLM's scheduler ships the mask regardless and no setting skips the
# application. Here the runner's `apply_grammar_bitmask` leaves out the rows that allow every
# token, and does nothing when none restricts: the logits are the same either way (a float32
# round trip of bfloat16 is exact).
APPLY_BITMASK = "vllm.v1.worker.gpu_model_runner:apply_grammar_bitmask"
GRAMMAR_OUTPUT = "vllm.v1.core.sched.output:GrammarOutput"


def skip_masks_that_allow_every_token() -> None:
    """Patch vLLM's model runner, in the worker process that loads it, as described above.
    With speculative tokens (several rows a request) vLLM's own application runs unchanged.
    Applying it twice is harmless."""
    from vllm.v1.worker import gpu_model_runner

    runner: Any = gpu_model_runner  # the name is imported there, not exported
    apply = runner.apply_grammar_bitmask
    if apply.__name__ == "apply_restricting_rows":
        return

    def apply_restricting_rows(
        scheduler_output: Any, grammar_output: Any, input_batch: Any, logits: Any
    ) -> None:
        if not scheduler_output.scheduled_spec_decode_tokens:
            grammar_output = _restricting_rows(grammar_output)
        if grammar_output is not None:
            apply(scheduler_output, grammar_output, input_batch, logits)

    runner.apply_grammar_bitmask = apply_restricting_rows


def _restricting_rows(grammar_output: Any) -> Any | None:
    """`grammar_output` (one row a request) without the rows that allow every token; None when
    no row is left."""
    from dataclasses import replace

    bitmask = grammar_output.grammar_bitmask
    restricting = ~(bitmask == -1).all(axis=1)
    if restricting.all():
        return grammar_output
    if not restricting.any():
        return None
    rows = restricting.nonzero()[0].tolist()
    ids, drafts = grammar_output.structured_output_request_ids, grammar_output.num_acceptable_drafts
    return replace(
        grammar_output,
        structured_output_request_ids=[ids[row] for row in rows],
        grammar_bitmask=bitmask[restricting],
        num_acceptable_drafts=None if drafts is None else [drafts[row] for row in rows],
    )


def masks_that_allow_every_token_skipped() -> bool:
    """Whether this process's model runner has the patch above."""
    from vllm.v1.worker import gpu_model_runner

    runner: Any = gpu_model_runner
    return bool(runner.apply_grammar_bitmask.__name__ == "apply_restricting_rows")


REQUEST_STATS = "vllm.v1.metrics.stats:RequestStateStats"


def request_timings(output: RequestOutput) -> tuple[float, float, float, float, int] | None:
    """vLLM's own timings of a request, in its engine core's monotonic clock: queued, first
    scheduled, first token, last token (0: not reached), and its preemptions. vLLM keeps them
    while it logs statistics (the gateway's scheduler figures need them on). The trace's queue,
    prefill and decode spans (gateway/observability/tracing.py's `EngineTimings`)."""
    stats = output.metrics
    if not isinstance(stats, RequestStateStats):
        return None
    return (
        stats.queued_ts,
        stats.scheduled_ts,
        stats.first_token_ts,
        stats.last_token_ts,
        stats.num_preemptions,
    )


TOUCHPOINTS = (
    Touchpoint(
        "StepScheduler",
        (
            Use(SCHEDULER, "schedule", ("throttle_prefills",)),
            Use(SCHEDULER, "get_request_counts", ()),
        ),
    ),
    Touchpoint(
        "engine_config",
        (Use(SCHEDULER, "vllm_config"), Use("vllm.config:VllmConfig", "additional_config")),
    ),
    Touchpoint("running", (Use(SCHEDULER, "running"),)),
    Touchpoint("waiting", (Use(SCHEDULER, "waiting"), Use(QUEUE, "__iter__", ()))),
    Touchpoint(
        "kv_holding_waiting", (Use(SCHEDULER, "kv_holding_waiting"), Use(QUEUE, "__iter__", ()))
    ),
    Touchpoint(
        "left_out",
        (
            Use(SCHEDULER, "running"),
            Use(SCHEDULER, "waiting"),
            Use(QUEUE, "remove_requests", ("requests",)),
            Use(QUEUE, "add_request", ("request",)),
        ),
    ),
    Touchpoint(
        "preempt",
        (Use(SCHEDULER, "running"), Use(SCHEDULER, "_preempt_request", ("request", "timestamp"))),
    ),
    Touchpoint("step_tokens_at_most", (Use(SCHEDULER, "max_num_scheduled_tokens"),)),
    Touchpoint(
        "Request",  # the fields the bulk cap's scheduler reads
        tuple(
            Use(REQUEST, name)
            for name in (
                "request_id",
                "priority",
                "arrival_time",
                "status",
                "num_computed_tokens",
                "num_prompt_tokens",
            )
        ),
    ),
    Touchpoint(
        "RequestStatus",
        tuple(
            Use("vllm.v1.request:RequestStatus", name)
            for name in ("WAITING", "PREEMPTED", "RUNNING")
        ),
    ),
    Touchpoint(
        "start_output_handler",
        (Use(ASYNC_LLM, "_run_output_handler", ()), Use(ASYNC_LLM, "output_handler")),
    ),
    Touchpoint(
        "core_processes",
        (
            Use(ASYNC_LLM, "engine_core"),
            Use("vllm.v1.engine.core_client:MPClient", "resources"),
            Use("vllm.v1.engine.core_client:BackgroundResources", "engine_manager"),
            Use("vllm.v1.engine.utils:CoreEngineProcManager", "processes"),
        ),
    ),
    Touchpoint(
        "keep_discarded_draws_off_cpu_generators",
        (
            Use(RUNNER, "_sample", ("logits", "spec_decode_metadata")),
            Use(RUNNER, "_bookkeeping_sync", None),
            Use(RUNNER, "input_batch"),
            Use(RUNNER, "discard_request_mask"),
            Use("vllm.v1.worker.gpu_input_batch:InputBatch", "generators"),
            Use("vllm.v1.worker.gpu_input_batch:InputBatch", "num_reqs"),
            Use("vllm.v1.worker.gpu_model_runner:CpuGpuBuffer", "np"),
        ),
    ),
    Touchpoint(
        "skip_masks_that_allow_every_token",
        (
            Use(GRAMMAR_OUTPUT, "structured_output_request_ids"),
            Use(GRAMMAR_OUTPUT, "grammar_bitmask"),
            Use(GRAMMAR_OUTPUT, "num_acceptable_drafts"),
            Use("vllm.v1.core.sched.output:SchedulerOutput", "scheduled_spec_decode_tokens"),
        ),
    ),
    Touchpoint(
        "request_timings",
        (
            Use("vllm.outputs:RequestOutput", "metrics"),
            *(
                Use(REQUEST_STATS, name)
                for name in (
                    "queued_ts",
                    "scheduled_ts",
                    "first_token_ts",
                    "last_token_ts",
                    "num_preemptions",
                )
            ),
        ),
    ),
    Touchpoint(
        "SchedulerStatsLogger",
        (
            Use(STAT_LOGGER, "__init__", ("vllm_config", "engine_index")),
            Use(
                STAT_LOGGER,
                "record",
                ("scheduler_stats", "iteration_stats", "mm_cache_stats", "engine_idx"),
            ),
            Use(STAT_LOGGER, "log_engine_initialized", ()),
            Use("vllm.v1.metrics.stats:SchedulerStats", "num_running_reqs"),
            Use("vllm.v1.metrics.stats:SchedulerStats", "num_waiting_reqs"),
            Use("vllm.v1.metrics.stats:IterationStats", "num_preempted_reqs"),
        ),
    ),
)
