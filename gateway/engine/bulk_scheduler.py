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
`additional_config["llm_gateway"]`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

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


class BulkCapScheduler(Scheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        extra = self.vllm_config.additional_config
        config = extra.get(CONFIG_KEY, {}) if isinstance(extra, dict) else {}
        self.bulk_priority: int = config.get("bulk_priority", 2)
        self.bulk_max_running: int = config.get("bulk_max_running", 0)
        step_tokens: int = config.get("interactive_step_tokens", 0)
        # Without chunked prefill a prompt longer than the bound could never be scheduled.
        chunked = self.scheduler_config.enable_chunked_prefill
        self.interactive_step_tokens = step_tokens if chunked else 0
        self._paused: list[Request] = []  # left out of the last step, still running
        self._prompts_first_steps = 0  # steps in a row that left every bulk request out

    def _is_bulk(self, request: Request) -> bool:
        return request.priority >= self.bulk_priority

    def _interactive_present(self) -> bool:
        queues = (self.running, self.waiting, self.kv_holding_waiting)
        return any(not self._is_bulk(r) for queue in queues for r in queue)

    def _interactive_prompt_pending(self) -> bool:
        """Whether an interactive request's prompt is to be computed in the next steps (not
        one waiting for its grammar or a remote KV cache: no step would carry it)."""
        queues = (self.waiting, self.kv_holding_waiting)
        if any(not self._is_bulk(r) and r.status in _SCHEDULABLE for q in queues for r in q):
            return True
        return any(
            not self._is_bulk(r) and r.num_computed_tokens < r.num_prompt_tokens
            for r in self.running
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
            (r for r in self.running if self._is_bulk(r)),
            key=lambda r: (r.priority, r.arrival_time),
        )

    def _preempt(self, requests: list[Request]) -> None:
        now = time.monotonic()
        for request in requests:
            self.running.remove(request)
            self._preempt_request(request, now)

    def get_request_counts(self) -> tuple[int, int]:
        running, waiting = super().get_request_counts()
        paused = sum(1 for r in self._paused if r.status == RequestStatus.RUNNING)
        return running - paused, waiting + paused

    @contextmanager
    def _step_tokens_bounded(self) -> Iterator[None]:
        budget = self.max_num_scheduled_tokens
        if self.interactive_step_tokens:
            self.max_num_scheduled_tokens = min(budget, self.interactive_step_tokens)
        try:
            yield
        finally:
            self.max_num_scheduled_tokens = budget

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        self._paused = []
        if not self._interactive_present():
            self._prompts_first_steps = 0
            return super().schedule(throttle_prefills)
        with self._step_tokens_bounded():
            if not self.bulk_max_running:
                return super().schedule(throttle_prefills)
            return self._schedule_capped(throttle_prefills)

    def _schedule_capped(self, throttle_prefills: bool) -> SchedulerOutput:
        cap = self._step_cap()
        bulk = self._running_bulk()
        if self.kv_cache_manager.usage >= PREEMPT_AT_KV_USAGE:
            self._preempt(bulk[self.bulk_max_running :])
            bulk = bulk[: self.bulk_max_running]
        paused = bulk[cap:]
        left_out = {r.request_id for r in paused}
        self.running = [r for r in self.running if r.request_id not in left_out]
        room = max(0, cap - len(bulk))
        waiting_bulk = [r for r in self.waiting if self._is_bulk(r)]  # in the queue's order
        held = waiting_bulk[room:]
        self.waiting.remove_requests(held)
        try:
            return super().schedule(throttle_prefills)
        finally:
            for request in held:
                self.waiting.add_request(request)
            self.running.extend(paused)
            self._paused = paused
