"""Whether the engine can hold a request's output to its constraint, asked before the request is
submitted.

vLLM checks a request's structured output as it accepts it, with the engine's grammar backend
(`auto`: xgrammar, else guidance or outlines), and raises the same `VLLMValidationError` as for
any other parameter. The gateway asks first, with vLLM's own check (`SamplingParams.verify`) on
a request that carries the constraint alone: its refusal is the constraint's, and the request
is refused naming the field that gave it (protocols/constraints.py). One function, so that
later work can compile elsewhere (a worker with a budget of its own).
"""

from __future__ import annotations

import asyncio
import copy

from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError
from vllm.v1.engine.async_llm import AsyncLLM

from protocols.constraints import UncompilableConstraint
from protocols.errors import ErrorKind


async def check_constraint(llm: AsyncLLM, params: SamplingParams) -> None:
    """Raises UncompilableConstraint when the engine's grammar backend cannot compile `params`'
    structured output (none: nothing to check). Compiling can take long (a large schema, a
    pathological regex), so it runs off the event loop."""
    if params.structured_outputs is None:
        return
    # verify() records the backend it chose on the constraint: a copy keeps `params` as it was.
    alone = SamplingParams(structured_outputs=copy.copy(params.structured_outputs))
    config = llm.vllm_config
    try:
        await asyncio.to_thread(
            alone.verify,
            llm.model_config,
            config.speculative_config,
            config.structured_outputs_config,
            llm.tokenizer,
        )
    except VLLMValidationError as e:
        message = f"The engine refused the request: {e}"
        raise UncompilableConstraint(ErrorKind.UNPROCESSABLE, message) from e
