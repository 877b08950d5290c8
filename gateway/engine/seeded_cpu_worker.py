"""The chat engine's worker extension (vLLM's `worker_extension_cls`): vLLM imports this module
in each worker process before it builds the model runner, which is the one place the seam's
patch for seeded sampling on CPU (`keep_discarded_draws_off_cpu_generators`) can be applied to
the runner the worker uses. The class adds nothing to the worker."""

from __future__ import annotations

from gateway.engine.vllm_seam import keep_discarded_draws_off_cpu_generators

keep_discarded_draws_off_cpu_generators()


class SeededSamplingOnCpu:
    """Named in the engine arguments; importing its module is what matters."""
