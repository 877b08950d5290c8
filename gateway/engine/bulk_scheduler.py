"""vLLM's scheduler with the bulk class held to a share of the running batch (BULK_MAX_RUNNING).

vLLM's priority policy orders the waiting queue and preempts the lowest class only when the
KV cache is full. On a machine whose steps are compute-bound (a CPU: a step's time grows with
the running batch), a chat request that joins 64 running batch requests waits for steps that
each carry 64 sequences. So while a request of an interactive class (priority below
BULK_PRIORITY) runs or waits in the engine, this scheduler keeps at most BULK_MAX_RUNNING bulk
requests in each step and keeps waiting bulk requests out of the batch.

The bulk requests past the cap are **paused**, not preempted: they keep their place in the
running queue and their KV cache blocks, and are left out of the steps (as vLLM leaves out a
running request its token budget has no room for). When no interactive request is left they
go on with the next step, with nothing to recompute. Preempting them instead (this
scheduler's first design) freed their blocks, so each chat's end resumed the whole held batch
at once as one burst of prefills, and the next chat arrived into it: a chat waited longer than
with no cap at all, and the batch recomputed itself once per chat (issue 30,
docs/PRIORITIES.md). Only when the KV cache runs short (PREEMPT_AT_KV_USAGE) are the bulk
requests past the cap preempted, which frees their blocks for the requests that run.

Two more rules serve a chat's first token, which waits for every step until its prompt is
computed:
- **Prompts first.** While an interactive request's prompt is being computed (it waits in the
  engine, or its prefill is not done), every bulk request is paused, not only those past the
  cap: those steps carry the prompts and the interactive requests' decodes alone. At most
  PROMPTS_FIRST_STEPS steps in a row: then one step runs bulk at its cap, so a stream of chats
  cannot stop the batch.
- **A step's tokens** (INTERACTIVE_STEP_TOKENS) are bounded while an interactive request is
  present: a burst of chats' prompts is computed a few at a time, so the first chats answer
  after a fraction of the burst's prefill instead of all of it (vLLM's chunked prefill splits
  a prompt longer than the bound).

Paused requests are counted as waiting in the engine's stats (`gateway_engine_waiting`): they
wait for a step. Loaded by vLLM in the engine process (`scheduler_cls`); the settings come in
`additional_config["llm_gateway"]`. vLLM's scheduler is reached only through
gateway/engine/vllm_seam.py: its queues, its token budget and its preemption are internals.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

from gateway.engine import vllm_seam as seam
from gateway.engine.vllm_seam import Request, RequestStatus, SchedulerOutput

CONFIG_KEY = "llm_gateway"

# The KV cache's used fraction from which the bulk requests past the cap are preempted (their
# blocks freed) instead of paused: a paused request's blocks are not there for the requests
# that run, and vLLM would otherwise preempt those to make room.
PREEMPT_AT_KV_USAGE = 0.9

# How many steps in a row may leave every bulk request out for interactive prompts.
PROMPTS_FIRST_STEPS = 16

_SCHEDULABLE = frozenset({RequestStatus.WAITING, RequestStatus.PREEMPTED})


def engine_config(
    bulk_priority: int, bulk_max_running: int, interactive_step_tokens: int = 0
) -> dict[str, Any]:
    """The `additional_config` that carries the settings to the engine process."""
    return {
        CONFIG_KEY: {
            "bulk_priority": bulk_priority,
            "bulk_max_running": bulk_max_running,
            "interactive_step_tokens": interactive_step_tokens,
        }
    }


class BulkCapScheduler(seam.StepScheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        vllm_config = seam.engine_config(self)
        extra = vllm_config.additional_config
        config = extra.get(CONFIG_KEY, {}) if isinstance(extra, dict) else {}
        self.bulk_priority: int = config.get("bulk_priority", 2)
        self.bulk_max_running: int = config.get("bulk_max_running", 0)
        step_tokens: int = config.get("interactive_step_tokens", 0)
        # Without chunked prefill a prompt longer than the bound could never be scheduled.
        chunked = vllm_config.scheduler_config.enable_chunked_prefill
        self.interactive_step_tokens = step_tokens if chunked else 0
        self._paused: list[Request] = []  # left out of the last step, still running
        self._prompts_first_steps = 0  # steps in a row that left every bulk request out

    def _is_bulk(self, request: Request) -> bool:
        return request.priority >= self.bulk_priority

    def _waiting(self) -> Iterator[Request]:
        return itertools.chain(seam.waiting(self), seam.kv_holding_waiting(self))

    def _interactive_present(self) -> bool:
        requests = itertools.chain(seam.running(self), self._waiting())
        return any(not self._is_bulk(r) for r in requests)

    def _interactive_prompt_pending(self) -> bool:
        """Whether an interactive request's prompt is to be computed in the next steps (not
        one waiting for its grammar or a remote KV cache: no step would carry it)."""
        if any(not self._is_bulk(r) and r.status in _SCHEDULABLE for r in self._waiting()):
            return True
        return any(
            not self._is_bulk(r) and r.num_computed_tokens < r.num_prompt_tokens
            for r in seam.running(self)
        )

    def _step_cap(self) -> int:
        """How many running bulk requests take part in this step."""
        if self._interactive_prompt_pending() and self._prompts_first_steps < PROMPTS_FIRST_STEPS:
            self._prompts_first_steps += 1
            return 0
        self._prompts_first_steps = 0
        return self.bulk_max_running

    def _running_bulk(self) -> list[Request]:
        """The running bulk requests, the oldest of the highest class first."""
        return sorted(
            (r for r in seam.running(self) if self._is_bulk(r)),
            key=lambda r: (r.priority, r.arrival_time),
        )

    def _preempt(self, requests: list[Request]) -> None:
        now = time.monotonic()
        for request in requests:
            seam.preempt(self, request, now)

    def waiting_in_running(self) -> int:
        return sum(1 for r in self._paused if r.status == RequestStatus.RUNNING)

    def step(self, schedule: Callable[[], SchedulerOutput]) -> SchedulerOutput:
        self._paused = []
        if not self._interactive_present():
            self._prompts_first_steps = 0
            return schedule()
        with seam.step_tokens_at_most(self, self.interactive_step_tokens):
            if not self.bulk_max_running:
                return schedule()
            return self._schedule_capped(schedule)

    def _schedule_capped(self, schedule: Callable[[], SchedulerOutput]) -> SchedulerOutput:
        cap = self._step_cap()
        bulk = self._running_bulk()
        if self.get_kv_cache_usage() >= PREEMPT_AT_KV_USAGE:
            self._preempt(bulk[self.bulk_max_running :])
            bulk = bulk[: self.bulk_max_running]
        paused = bulk[cap:]
        room = max(0, cap - len(bulk))
        waiting_bulk = [r for r in seam.waiting(self) if self._is_bulk(r)]  # in the queue's order
        try:
            with seam.left_out(self, paused, waiting_bulk[room:]):
                return schedule()
        finally:
            self._paused = paused
