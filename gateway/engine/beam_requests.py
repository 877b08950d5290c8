"""Beam search on the engine: each step's beams one engine request each, for their likeliest
next tokens (the algorithm, transformers', is gateway/engine/beams.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import aclosing
from functools import partial
from itertools import count
from typing import TYPE_CHECKING

import msgspec
from vllm import SamplingParams
from vllm.inputs.engine import tokens_input
from vllm.v1.engine.async_llm import AsyncLLM

from gateway.engine.beams import Hypothesis, NextTokens, beam_search
from gateway.engine.engine_errors import FAILED, engine_failure
from gateway.engine.outputs import EngineStep, OutputReader
from gateway.observability.tracing import Span, child
from protocols.generation import SamplingOptions

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest

_MAX_LOGPROBS = 20  # vLLM's default max_logprobs: beams beyond 10 see fewer candidates


async def searched(
    llm: AsyncLLM,
    reader: OutputReader,
    token_ids: list[int],
    options: SamplingOptions,
    *,
    room: int,
    eos_token_ids: frozenset[int],
    request_id: str,
    priority: int,
    lora: LoRARequest | None,
    span: Span | None = None,
) -> list[EngineStep]:
    """Every beam, best first, each as one final step whose tokens carry the log-probability
    the model gave them (no alternatives); `room`: the tokens left in the context. Traced
    (`span`, the prompt's), each step is a child span of it."""
    sample = options.do_sample and options.temperature > 0
    ask = partial(_next_tokens, llm, request_id, priority, lora)
    beams = await beam_search(
        token_ids,
        ask if span is None else partial(_traced_step, span, ask, count(1)),
        num_beams=options.num_beams,
        max_new_tokens=min(options.max_new_tokens, room),
        eos_token_ids=frozenset() if options.ignore_eos else eos_token_ids,
        length_penalty=options.length_penalty,
        early_stopping=options.early_stopping,
        temperature=options.temperature if sample else None,
        seed=options.seed,
    )
    return [_step(beam, reader, options) for beam in beams]


async def _traced_step(
    span: Span, ask: NextTokens, steps: Iterator[int], sequences: list[list[int]], keep: int
) -> list[dict[int, float]]:
    """One step of the search as a child of the prompt's span: which step, how many beams
    ran in it (each one engine request), how many candidates each asked for."""
    attributes = {
        "llm_gateway.beam.step": next(steps),
        "llm_gateway.beam.sequences": len(sequences),
        "llm_gateway.beam.candidates": keep,
    }
    with child(span, "llm_gateway.beam_step", attributes):
        return await ask(sequences, keep)


def _step(beam: Hypothesis, reader: OutputReader, options: SamplingOptions) -> EngineStep:
    return EngineStep(
        str(reader.tokenizer.decode(beam.token_ids, options.skip_special_tokens)),
        beam.token_ids,
        True,
        beam.ended_at_eos,
        "stop" if beam.ended_at_eos else "length",
        0,
        [
            msgspec.structs.replace(reader.token(t, None), logprob=logprob)
            for t, logprob in zip(beam.token_ids, beam.logprobs, strict=True)
        ],
    )


async def _next_tokens(
    llm: AsyncLLM,
    request_id: str,
    priority: int,
    lora: LoRARequest | None,
    sequences: list[list[int]],
    count: int,
) -> list[dict[int, float]]:
    """Each sequence's `count` likeliest next tokens, with their log-probabilities."""
    params = SamplingParams(
        max_tokens=1, temperature=0.0, logprobs=min(count, _MAX_LOGPROBS), detokenize=False
    )

    async def one(i: int, sequence: list[int]) -> dict[int, float]:
        name = f"{request_id}-{i}"
        outputs = llm.generate(
            tokens_input(sequence), params, name, lora_request=lora, priority=priority
        )
        async with aclosing(outputs):
            async for output in outputs:
                if output.finished:
                    completion = output.outputs[0]
                    if completion.finish_reason in FAILED or not completion.logprobs:
                        raise engine_failure(completion.finish_reason)
                    return {t: lp.logprob for t, lp in completion.logprobs[0].items()}
        raise engine_failure("no output")

    return list(await asyncio.gather(*(one(i, s) for i, s in enumerate(sequences))))
