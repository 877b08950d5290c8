"""`llm-gateway bench speculation`: vLLM's ngram speculative decoding against none (issue 60).

Each variant runs in a fresh process that builds an in-process `AsyncLLM` at the gateway's CPU
defaults but typical sampling's logits processor, which vLLM refuses beside speculation
(compiled unless `--enforce-eager`) and answers three kinds of prompt greedily, each
to its own end: a chat question (little of the answer is in the prompt), a code edit (the
answer repeats the prompt's code) and a quote from a passage (the answer copies a sentence).
Per kind and concurrency: output tok/s and the tokens each of a request's outputs carried (one
an engine step, unless the reader fell behind and vLLM merged two: about 1.0 without
speculation; above it, the drafts accepted). The report says whether the answers at one
caller are the same token for token in every variant and repeat: on a CPU in bfloat16 they
need not be, a verification step computing several positions at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import msgspec

from gateway_bench import machine
from gateway_bench.children import every_variant, result_line
from gateway_bench.options import Options, Positive, Scenario
from gateway_bench.report import Report, Section, Table

CODE = """def merge_intervals(intervals):
    intervals = sorted(intervals, key=lambda pair: pair[0])
    merged = []
    for start, end in intervals:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged
"""
PASSAGE = (
    "The harbour of Port Elwin was built in 1842 by the merchants of the valley. Its first "
    "lighthouse stood on the northern breakwater and burned whale oil until 1901. In the "
    "winter of 1923 a storm broke the southern pier, and the town rebuilt it in stone within "
    "two years. Today the harbour serves fishing boats and a ferry to the islands, and the old "
    "customs house is a museum of the town's trade."
)
KINDS = {
    "chat": "Request {n}: what should I pack for a weekend hiking trip? Give a short list.",
    "code-edit": "Request {n}: rename the function below to `merge` and give back the whole "
    "code, nothing else.\n\n" + CODE,
    "rag-quote": "Request {n}: " + PASSAGE + "\n\nQuote, word for word, the sentence of the "
    "passage above that tells what happened in 1923.",
}
VARIANTS: dict[str, dict[str, Any] | None] = {
    "none": None,
    "ngram k=5": {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    },
}


class SpeculationOptions(Options, frozen=True, kw_only=True):
    repeats: Positive = 2
    rounds: Positive = 2  # batches per kind and concurrency
    tokens: Positive = 160  # an answer's cap (each ends at its own end of text before)
    concurrency: list[Positive] = msgspec.field(default_factory=lambda: [1, 8, 32])
    variants: list[str] = msgspec.field(default_factory=lambda: list(VARIANTS))
    child: str = ""  # one variant's measurement, in the process the parent started


QUICK = SpeculationOptions(
    repeats=1, rounds=1, tokens=16, concurrency=[1, 2], enforce_eager=True, quick=True
)


async def _measure(options: SpeculationOptions, variant: str) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    from gateway.engine.default_model import prepare_default_model
    from gateway.engine.engine_args import engine_args
    from gateway_bench.targets import tokenizer

    settings = options.engine_settings(machine.cpu_defaults(options.dtype).dtype)
    # vLLM refuses custom logits processors beside speculative decoding: TYPICAL_SAMPLING's
    # (gateway/engine/typical_sampling.py, on by default on a CPU) is off in every variant.
    settings = msgspec.structs.replace(settings, typical_sampling=False)
    model = str(prepare_default_model())
    template = tokenizer(model)
    args = engine_args(settings, model)
    args.speculative_config = VARIANTS[variant]
    llm = await asyncio.to_thread(AsyncLLM.from_engine_args, args)
    params = SamplingParams(
        max_tokens=options.tokens, temperature=0.0, output_kind=RequestOutputKind.DELTA
    )
    serial = iter(range(1_000_000))

    async def one(kind: str) -> tuple[list[int], int]:
        n = next(serial)
        asked = [{"role": "user", "content": KINDS[kind].format(n=n)}]
        prompt = template.apply_chat_template(asked, tokenize=False, add_generation_prompt=True)
        tokens: list[int] = []
        steps = 0
        async for out in llm.generate(prompt, params, f"{kind}-{n}"):
            steps += 1
            tokens.extend(out.outputs[0].token_ids)
        return tokens, steps

    await asyncio.gather(*(one(kind) for kind in KINDS for _ in range(2)))  # warm-up
    figures: dict[str, Any] = {}
    for kind in KINDS:
        for c in options.concurrency:
            rates, per_step, answers = [], [], []
            for _ in range(options.rounds):
                begin = time.perf_counter()
                done = await asyncio.gather(*(one(kind) for _ in range(c)))
                rates.append(sum(len(t) for t, _ in done) / (time.perf_counter() - begin))
                per_step += [len(t) / s for t, s in done if s]
                answers += [t for t, _ in done]
            digest = hashlib.sha256(json.dumps(answers).encode()).hexdigest()[:12]
            figures[f"{kind} c{c}"] = {
                "tok_s": round(statistics.mean(rates), 1),
                "tokens_per_step": round(statistics.mean(per_step), 2),
                "answers": digest if c == 1 else "",
            }
    llm.shutdown()
    return figures


async def _run(options: SpeculationOptions, command: str) -> tuple[str, Path | None, bool]:
    if options.child:
        return result_line(await _measure(options, options.child)), None, True
    runs = await asyncio.to_thread(measure_variants, options)
    return _table(options, command, runs), None, all(runs.values())


def measure_variants(options: SpeculationOptions) -> dict[str, list[dict[str, Any]]]:
    """Every variant `repeats` times, each in a child process: each run's figures by variant."""
    env = {**os.environ, **machine.cpu_defaults(options.dtype).environment}
    child = ["--tokens", str(options.tokens), "--rounds", str(options.rounds)]
    child += ["--concurrency", ",".join(map(str, options.concurrency))]
    child += ["--enforce-eager" if options.enforce_eager else "--no-enforce-eager"]
    return every_variant(
        options.variants,
        options.repeats,
        lambda name: ["speculation", "--child", name, *child],
        lambda _: env,
    )


def _differing(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The kinds whose answers at one caller differ between runs (any variant, any repeat)."""
    every = [figures for variant in runs.values() for figures in variant]
    found = {
        kind: {f[f"{kind} c1"]["answers"] for f in every if f"{kind} c1" in f} for kind in KINDS
    }
    return [kind for kind, digests in found.items() if len(digests) > 1]


def _table(options: SpeculationOptions, command: str, runs: dict[str, list[dict[str, Any]]]) -> str:
    base = options.variants[0]
    columns = ["kind", "c", *(f"{n} tok/s" for n in options.variants)]
    columns += [f"{n} tokens/step" for n in options.variants[1:]]
    columns += [f"{n} / {base}" for n in options.variants[1:]]
    table = Table(columns)
    others = options.variants[1:]
    for kind in KINDS:
        for c in options.concurrency:
            key = f"{kind} c{c}"
            rate = {n: statistics.mean(r[key]["tok_s"] for r in rs) for n, rs in runs.items() if rs}
            steps = {
                n: statistics.mean(r[key]["tokens_per_step"] for r in rs)
                for n, rs in runs.items()
                if rs
            }
            row: list[object] = [kind, c, *(f"{rate.get(n, 0):.1f}" for n in options.variants)]
            row += [f"{steps.get(n, 0):.2f}" for n in others]
            row += [
                f"{rate.get(n, 0) / rate[base]:.2f}x" if rate.get(base) else "-" for n in others
            ]
            table.rows.append(row)
    differing = _differing(runs) if all(runs.values()) else ["a variant failed"]
    same = f"NOT the same ({', '.join(differing)})" if differing else "the same"
    note = f"Greedy answers at one caller, every variant and repeat: {same} token for token."
    host = machine.describe(options.dtype)
    report = Report("llm-gateway bench speculation", command, host, [Section(table=table)])
    return report.markdown() + "\n" + note + "\n"


def _check(options: SpeculationOptions) -> str | None:
    unknown = [n for n in options.variants if n not in VARIANTS]
    if unknown:
        return f"--variants: no variant {', '.join(unknown)} (there are {', '.join(VARIANTS)})"
    return "--profile: each variant's engine is in-process, no server" if options.profile else None


SCENARIO = Scenario(
    "speculation",
    "vLLM's ngram speculative decoding against none on chat, code-edit and quoting prompts, "
    "each variant in a fresh in-process engine at the gateway's CPU defaults.",
    SpeculationOptions,
    QUICK,
    _run,
    check=_check,
)
