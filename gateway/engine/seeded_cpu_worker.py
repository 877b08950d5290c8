"""The chat engine's worker extension (vLLM's `worker_extension_cls`): vLLM imports this module
in each worker process before it builds the model runner, which is the one place the seam's
patches to that runner can be applied: seeded sampling on CPU
(`keep_discarded_draws_off_cpu_generators`) and no work for grammar masks that allow every
token (`skip_masks_that_allow_every_token`: `auto` tools' free text). The class adds nothing to
the worker."""

from __future__ import annotations

from gateway.engine.vllm_seam import (
    keep_discarded_draws_off_cpu_generators,
    skip_masks_that_allow_every_token,
)

keep_discarded_draws_off_cpu_generators()
skip_masks_that_allow_every_token()


class SeededSamplingOnCpu:
    """Named in the engine arguments; importing its module is what matters."""
