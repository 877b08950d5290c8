"""vLLM's scheduler with the bulk class held to a share of the running batch (BULK_MAX_RUNNING).

vLLM's priority policy orders the waiting queue and preempts the lowest class only when the
KV cache is full. On a machine whose steps are compute-bound (a CPU: a step's time grows with
the running batch), a chat request that joins 64 running batch requests waits for steps that
each carry 64 sequences. So while a request of an interactive class (priority below
BULK_PRIORITY) runs or waits in the engine, this scheduler keeps at most BULK_MAX_RUNNING bulk
requests running: it preempts the newest ones beyond that (vLLM's own preemption: each is
recomputed later from its prompt and the tokens it has, mostly from the prefix cache, and its
output continues where it stopped) and keeps waiting bulk requests out of the step. With no
interactive request left, bulk fills the batch again.

Loaded by vLLM in the engine process (`scheduler_cls`); the cap comes in
`additional_config["llm_gateway"]`.
"""

from __future__ import annotations

import time
from typing import Any

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

CONFIG_KEY = "llm_gateway"


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

    def _is_bulk(self, request: Request) -> bool:
        return request.priority >= self.bulk_priority

    def _interactive_present(self) -> bool:
        queues = (self.running, self.waiting, self.kv_holding_waiting)
        return any(not self._is_bulk(r) for queue in queues for r in queue)

    def _preempt_bulk_beyond_cap(self) -> int:
        """Preempts the newest running bulk requests past the cap; how many bulk still run."""
        bulk = sorted(
            (r for r in self.running if self._is_bulk(r)),
            key=lambda r: (r.priority, r.arrival_time),
        )
        now = time.monotonic()
        for request in bulk[self.bulk_max_running :]:
            self.running.remove(request)
            self._preempt_request(request, now)
        return min(len(bulk), self.bulk_max_running)

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        if not self.bulk_max_running or not self._interactive_present():
            return super().schedule(throttle_prefills)
        room = self.bulk_max_running - self._preempt_bulk_beyond_cap()
        waiting_bulk = [r for r in self.waiting if self._is_bulk(r)]  # in the queue's order
        held = waiting_bulk[room:]
        self.waiting.remove_requests(held)
        try:
            return super().schedule(throttle_prefills)
        finally:
            for request in held:
                self.waiting.add_request(request)
