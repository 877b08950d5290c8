"""`llm-gateway bench quantized`: the default model's weights in bfloat16 against int8 (W8A8) and
int4 (W4A16) copies of them (gateway_bench/quantize.py), issue 60.

Each variant runs in a fresh process that builds an in-process `AsyncLLM` at the gateway's CPU
defaults (compiled unless `--enforce-eager`) on its checkpoint, made once into the cache beside
the converted default model. It answers chat questions greedily, each to its own end or
`--tokens`, and then measures output tok/s at each concurrency (`ignore_eos`, `--tokens` each).
The report gives each variant's tok/s beside bfloat16's, and how far its greedy answers agree
with bfloat16's: how many are the same token for token, and the mean share of an answer's
tokens before the first that differs.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from pathlib import Path
from typing import Any

import msgspec

from gateway_bench import machine
from gateway_bench.children import every_variant, result_line
from gateway_bench.made_once import made_once
from gateway_bench.options import Options, Positive, Scenario
from gateway_bench.quantize import FORMATS, quantized_checkpoint
from gateway_bench.report import Report, Section, Table

QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about autumn.",
    "Explain photosynthesis in two sentences.",
    "List three uses of a paperclip.",
    "What is 12 times 7?",
    "Translate 'good morning' into Spanish.",
    "Give me a tip for learning to code.",
    "Who wrote Romeo and Juliet?",
    "Describe a cat in one sentence.",
    "Why is the sky blue?",
    "Write a Python function that reverses a string.",
    "What is the boiling point of water?",
    "Name a planet in our solar system.",
    "Suggest a name for a bakery.",
    "What does a compiler do?",
    "Tell me a short joke.",
)
BASE = "bfloat16"
VARIANTS = (BASE, *FORMATS)
_RECIPE = "r1"  # change it when gateway_bench/quantize.py changes: the cached copies are remade


class QuantizedOptions(Options, frozen=True, kw_only=True):
    repeats: Positive = 2
    rounds: Positive = 2  # batches per concurrency
    tokens: Positive = 64  # each answer's cap, and each measured request's length
    questions: Positive = len(QUESTIONS)  # how many of the chat questions are answered
    concurrency: list[Positive] = msgspec.field(default_factory=lambda: [1, 8, 32, 64])
    variants: list[str] = msgspec.field(default_factory=lambda: list(VARIANTS))
    child: str = ""  # one variant's measurement, in the process the parent started


QUICK = QuantizedOptions(
    repeats=1, rounds=1, tokens=8, questions=2, concurrency=[1, 2], enforce_eager=True, quick=True
)


def checkpoint(variant: str) -> Path:
    """The variant's model directory: the converted default model, or its quantized copy."""
    from gateway.config.cache import default_cache_dir
    from gateway.engine.default_model import prepare_default_model

    source = prepare_default_model()
    if variant == BASE:
        return source
    return made_once(
        default_cache_dir() / "bench-quantized" / f"{source.name}-{variant}-{_RECIPE}",
        lambda scratch: quantized_checkpoint(source, scratch, variant),
    )


async def _measure(options: QuantizedOptions, variant: str) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

    from gateway.engine.engine_args import engine_args
    from gateway_bench.targets import tokenizer

    model = str(await asyncio.to_thread(checkpoint, variant))
    settings = options.engine_settings(machine.cpu_defaults(options.dtype).dtype)
    llm = await asyncio.to_thread(AsyncLLM.from_engine_args, engine_args(settings, model))
    template = tokenizer(model)
    serial = iter(range(1_000_000))

    async def tokens_of(question: str, params: SamplingParams) -> list[int]:
        asked = [{"role": "user", "content": question}]
        prompt = template.apply_chat_template(asked, tokenize=False, add_generation_prompt=True)
        final: list[int] = []
        async for out in llm.generate(prompt, params, f"{variant}-{next(serial)}"):
            final = list(out.outputs[0].token_ids)
        return final

    greedy = SamplingParams(max_tokens=options.tokens, temperature=0.0)
    answers = [await tokens_of(q, greedy) for q in QUESTIONS[: options.questions]]
    steady = SamplingParams(max_tokens=options.tokens, temperature=0.0, ignore_eos=True)
    figures: dict[str, Any] = {"answers": answers}
    for c in options.concurrency:
        rates = []
        for round_ in range(options.rounds):
            asked = [f"{QUESTIONS[i % len(QUESTIONS)]} ({round_}.{i})" for i in range(c)]
            begin = time.perf_counter()
            done = await asyncio.gather(*(tokens_of(q, steady) for q in asked))
            rates.append(sum(map(len, done)) / (time.perf_counter() - begin))
        figures[f"c{c}"] = round(statistics.mean(rates), 1)
    llm.shutdown()
    return figures


async def _run(options: QuantizedOptions, command: str) -> tuple[str, Path | None, bool]:
    if options.child:
        return result_line(await _measure(options, options.child)), None, True
    runs = await asyncio.to_thread(measure_variants, options)
    return _table(options, command, runs), None, all(runs.values())


def measure_variants(options: QuantizedOptions) -> dict[str, list[dict[str, Any]]]:
    """Every variant `repeats` times, each in a child process: each run's figures by variant."""
    env = {**os.environ, **machine.cpu_defaults(options.dtype).environment}
    child = ["--tokens", str(options.tokens), "--rounds", str(options.rounds)]
    child += ["--questions", str(options.questions)]
    child += ["--concurrency", ",".join(map(str, options.concurrency))]
    child += ["--enforce-eager" if options.enforce_eager else "--no-enforce-eager"]
    return every_variant(
        options.variants,
        options.repeats,
        lambda name: ["quantized", "--child", name, *child],
        lambda _: env,
        lambda figures: {k: v for k, v in figures.items() if k != "answers"},
    )


def agreement(answers: list[list[int]], reference: list[list[int]]) -> tuple[int, float]:
    """How many answers equal the reference's token for token, and the mean share of each
    reference answer's tokens before the first that differs."""
    same = sum(a == r for a, r in zip(answers, reference, strict=True))
    shares = []
    for a, r in zip(answers, reference, strict=True):
        differs = next((i for i, (x, y) in enumerate(zip(a, r, strict=False)) if x != y), None)
        shared = min(len(a), len(r)) if differs is None else differs
        shares.append(shared / max(len(r), 1))
    return same, statistics.mean(shares) if shares else 0.0


def _table(options: QuantizedOptions, command: str, runs: dict[str, list[dict[str, Any]]]) -> str:
    columns = ["weights", *(f"c={c} tok/s" for c in options.concurrency)]
    columns += [f"c={c} ÷ {BASE}" for c in options.concurrency]
    columns += ["greedy answers as bfloat16's", "share of an answer before the first difference"]
    table = Table(columns)
    rate = {
        n: {c: statistics.mean(r[f"c{c}"] for r in rs) for c in options.concurrency}
        for n, rs in runs.items()
        if rs
    }
    reference = runs.get(BASE, [])
    base = rate.get(BASE)
    for name in options.variants:
        if name not in rate:
            table.rows.append([name, "failed"])
            continue
        row: list[object] = [name, *(f"{rate[name][c]:.1f}" for c in options.concurrency)]
        row += [f"{rate[name][c] / base[c]:.2f}x" if base else "-" for c in options.concurrency]
        if reference:
            same, share = agreement(runs[name][0]["answers"], reference[0]["answers"])
            row += [f"{same} of {options.questions}", f"{share:.0%}"]
        else:
            row += ["-", "-"]
        table.rows.append(row)
    host = machine.describe(options.dtype)
    report = Report("llm-gateway bench quantized", command, host, [Section(table=table)])
    return report.markdown()


def _check(options: QuantizedOptions) -> str | None:
    unknown = [n for n in options.variants if n not in VARIANTS]
    if unknown:
        return f"--variants: no variant {', '.join(unknown)} (there are {', '.join(VARIANTS)})"
    if options.questions > len(QUESTIONS):
        return f"--questions: at most {len(QUESTIONS)}"
    return "--profile: each variant's engine is in-process, no server" if options.profile else None


SCENARIO = Scenario(
    "quantized",
    "The default model's weights in bfloat16 against int8 (W8A8) and int4 (W4A16) copies: "
    "tok/s and greedy agreement, each variant in a fresh in-process engine.",
    QuantizedOptions,
    QUICK,
    _run,
    check=_check,
)
