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

Paused requests are counted as waiting in the engine's stats (`gateway_engine_waiting`): they
wait for a step. Loaded by vLLM in the engine process (`scheduler_cls`); the cap comes in
`additional_config["llm_gateway"]`.
"""

from __future__ import annotations

import time
from typing import Any

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

CONFIG_KEY = "llm_gateway"

# The KV cache's used fraction from which the bulk requests past the cap are preempted (their
# blocks freed) instead of paused: a paused request's blocks are not there for the requests
# that run, and vLLM would otherwise preempt those to make room.
PREEMPT_AT_KV_USAGE = 0.9


def engine_config(bulk_priority: int, bulk_max_running: int) -> dict[str, Any]:
    """The `additional_config` that carries the cap to the engine process."""
    return {CONFIG_KEY: {"bulk_priority": bulk_priority, "bulk_max_running": bulk_max_running}}


class BulkCapScheduler(Scheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        extra = self.vllm_config.additional_config
        config = extra.get(CONFIG_KEY, {}) if isinstance(extra, dict) else {}
        self.bulk_priority: int = config.get("bulk_priority", 2)
        self.bulk_max_running: int = config.get("bulk_max_running", 0)
        self._paused: list[Request] = []  # left out of the last step, still running

    def _is_bulk(self, request: Request) -> bool:
        return request.priority >= self.bulk_priority

    def _interactive_present(self) -> bool:
        queues = (self.running, self.waiting, self.kv_holding_waiting)
        return any(not self._is_bulk(r) for queue in queues for r in queue)

    def _bulk_beyond_cap(self) -> list[Request]:
        """The running bulk requests past the cap: the newest (the lowest class first)."""
        bulk = sorted(
            (r for r in self.running if self._is_bulk(r)),
            key=lambda r: (r.priority, r.arrival_time),
        )
        return bulk[self.bulk_max_running :]

    def _preempt(self, requests: list[Request]) -> None:
        now = time.monotonic()
        for request in requests:
            self.running.remove(request)
            self._preempt_request(request, now)

    def get_request_counts(self) -> tuple[int, int]:
        running, waiting = super().get_request_counts()
        paused = sum(1 for r in self._paused if r.status == RequestStatus.RUNNING)
        return running - paused, waiting + paused

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        self._paused = []
        if not self.bulk_max_running or not self._interactive_present():
            return super().schedule(throttle_prefills)
        beyond = self._bulk_beyond_cap()
        paused: list[Request] = []
        if self.kv_cache_manager.usage >= PREEMPT_AT_KV_USAGE:
            self._preempt(beyond)
        else:
            paused = beyond
            left_out = {r.request_id for r in paused}
            self.running = [r for r in self.running if r.request_id not in left_out]
        running_bulk = sum(1 for r in self.running if self._is_bulk(r))
        room = max(0, self.bulk_max_running - running_bulk)
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
