"""What vLLM's scheduler last reported, for the metrics."""

from __future__ import annotations

import msgspec


class SchedulerView(msgspec.Struct):
    """What vLLM's scheduler last reported: its running batch and waiting queue (after the
    latest step), and the requests it preempted since the engine started."""

    preemptions: int = 0
    running: int = 0
    waiting: int = 0
