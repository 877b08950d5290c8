"""Knowing when vLLM gives an engine up, and why (docs/ARCHITECTURE.md, "When the engine
dies")."""

from __future__ import annotations

from collections.abc import Callable

from vllm.v1.engine.async_llm import AsyncLLM

from gateway.engine.vllm_seam import core_processes, start_output_handler


def on_death(llm: AsyncLLM, callback: Callable[[str], None], closing: Callable[[], bool]) -> None:
    """Calls `callback(reason)` once vLLM gives `llm` up, unless `closing()` says the gateway
    shut it down itself.

    vLLM's own monitor thread waits on the engine-core process; when it exits, the monitor
    marks the client dead and closes its sockets, and the output handler task fails every
    running request with `EngineDeadError` and ends. An engine-core that reports its own
    fatal error ends that task the same way. Its end is the one event for both. Must be
    called on the event loop the engine serves.
    """
    # AsyncLLM starts the handler with the first request, or at once when it is built on
    # a running loop; VllmEngine.start builds it in a worker thread, so start it here.
    handler = start_output_handler(llm)

    def ended(_: object) -> None:
        if not closing():
            callback(death_reason(llm))

    handler.add_done_callback(ended)


def core_pids(llm: AsyncLLM) -> list[int]:
    return [int(p.pid) for p in core_processes(llm) if p.pid is not None]


def death_reason(llm: AsyncLLM) -> str:
    exited = [
        f"{p.name} (pid {p.pid}) exited with code {p.exitcode}"
        for p in core_processes(llm)
        if p.exitcode is not None
    ]
    return "; ".join(exited) or "vLLM's output handler stopped"
