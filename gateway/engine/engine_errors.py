"""The engine's failures translated into `GenerationError`s: whose fault each is, in words a
client can act on."""

from __future__ import annotations

from vllm.exceptions import VLLMValidationError
from vllm.v1.engine.exceptions import EngineDeadError

from protocols.constraints import UncompilableConstraint
from protocols.errors import ErrorKind, GenerationError

# The finish reasons of a sequence the engine gave up.
FAILED = frozenset({"error", "abort"})


def refusal(error: VLLMValidationError) -> GenerationError:
    """vLLM's own check of a request ours let through (a stop token outside the vocabulary):
    the request's fault, not the engine's. A constraint its grammar backend cannot compile is
    refused before the request is submitted (gateway/engine/constraint_check.py)."""
    return GenerationError(ErrorKind.UNPROCESSABLE, f"The engine refused the request: {error}")


def translated(error: Exception) -> Exception:
    if isinstance(error, VLLMValidationError):
        return refusal(error)
    if isinstance(error, EngineDeadError):
        # The gateway builds another engine (gateway/engine/holder.py): the same request may
        # succeed if sent again. vLLM's own message points at a log the client cannot see.
        message = "The engine stopped while generating; retry once /health answers 200"
        return GenerationError(ErrorKind.ENGINE_UNAVAILABLE, message)
    return error


def engine_failure(reason: str | None, constrained: bool = False) -> GenerationError:
    if constrained and reason == "error":
        # What vLLM's engine core answers when the grammar it compiles for the request fails
        # (after its own check let the constraint through), or rejects a token.
        message = "The engine could not hold the output to its constraint (its grammar failed)"
        return UncompilableConstraint(ErrorKind.UNPROCESSABLE, message)
    return GenerationError(ErrorKind.ENGINE_ERROR, f"The engine ended the request: {reason}")
