"""Whether the engine can hold a request's output to its constraint, asked before the request is
submitted, within a budget of time and memory.

The engine compiles a constraint (xgrammar, against the whole vocabulary) in a thread of its
own process, and vLLM gives up waiting on a regex after 5 s but cannot stop the thread: a
large constraint kept both cores busy for a minute after its refusal, and a large schema or
enum took the engine's memory past 10 GB. So the gateway compiles each constraint first, as
the engine's backend will, in a worker process (gateway/engine/compile_worker.py, shared
fairly by callers: gateway/engine/compile_pool.py) whose address space is capped at
CONSTRAINT_COMPILE_MEMORY_MIB above its start. A caller's check, its wait for a worker
included, has CONSTRAINT_COMPILE_SECONDS; its compile is killed past them, or as soon as the
request is gone: no compile outlives its request. It runs inside the caller's admission slot.

Only the constraint's own verdicts are kept, by the constraint's hash, for every caller: it
compiled, the compiler refused it, or the worker itself reported running out of its memory.
A compile past its deadline, a worker that died without a verdict (killed from outside, the
kernel's OOM killer) or none free in time is a fault: the caller gets a retryable
ENGINE_UNAVAILABLE naming it, nothing is kept, and the next request compiles afresh. A
request whose constraint is compiling for another waits for that verdict (within its own
deadline) rather than compiling it again. What compiled here compiles in the engine within
the same budget. vLLM's own check (`SamplingParams.verify`: its backend's other refusals)
then runs on what compiled, off the event loop. The size limits before all this are
protocols/constraint_budget.py's.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import hashlib
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
import xgrammar
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import StructuredOutputsParams
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.structured_output.utils import choice_as_grammar, grammar_is_likely_lark

from gateway.engine.compile_pool import CompileFault, CompilePool
from gateway.engine.compile_worker import Job, Setup, Verdict
from gateway.observability.tracing import Span, child
from protocols.constraints import ANY_OBJECT, UncompilableConstraint
from protocols.errors import ErrorKind, GenerationError

log = logging.getLogger(__name__)
_VERDICTS_KEPT = 4096
MIB = 1 << 20


@dataclass(frozen=True)
class CompileLimits:
    seconds: float = 5.0
    memory_mib: int = 1024
    workers: int = 2


def _constraint_key(so: StructuredOutputsParams) -> bytes:
    """`so`'s request fields (not what vLLM records on it: its backend), hashed."""
    fields = {f.name: getattr(so, f.name) for f in dataclasses.fields(so)}
    public = {name: value for name, value in fields.items() if not name.startswith("_")}
    return hashlib.sha256(msgspec.msgpack.encode(public)).digest()


def _job_key(job: Job) -> bytes:
    return hashlib.sha256(msgspec.msgpack.encode(job)).digest()


def job_of(so: StructuredOutputsParams) -> Job | None:
    """What the engine's xgrammar backend compiles for `so` (None: nothing the gateway sets)."""
    if so.json is not None:
        spec = so.json if isinstance(so.json, str) else msgspec.json.encode(so.json).decode()
        return Job("json", spec)
    if so.json_object:
        return Job("json", ANY_OBJECT)
    if so.regex is not None:
        return Job("regex", so.regex)
    if so.choice is not None:
        return Job("ebnf", choice_as_grammar(so.choice))
    if so.grammar is not None:
        return Job("lark" if grammar_is_likely_lark(so.grammar) else "ebnf", so.grammar)
    return None


VerdictReason = Literal["compiled", "uncompilable", "memory"]


@dataclass(frozen=True)
class Kept:
    """A verdict kept for a constraint, and what it was made for: it compiled, the compiler
    refused it, or its compile needed more than CONSTRAINT_COMPILE_MEMORY_MIB (the worker said
    so itself)."""

    reason: VerdictReason
    error: str | None  # the refusal's words (None: it compiled)


@dataclass
class CallerCompiles:
    """One caller's compiles: run, ended in a fault, and the most other callers' compiles one
    of them waited behind for a worker."""

    compiles: int = 0
    faults: int = 0
    most_waited_behind: int = 0


class ConstraintChecker:
    """The compile budget of one engine: its workers (gateway/engine/compile_pool.py), and the
    verdicts so far. `compiles` counts compiles run, `faults` those that ended without a verdict
    (their deadline, their worker's death), `killed` workers replaced; `verifications` vLLM's
    own checks run (a constraint it accepted is not checked again)."""

    def __init__(self, llm: AsyncLLM, limits: CompileLimits) -> None:
        self._llm = llm
        self.limits = limits
        self._verdicts: OrderedDict[bytes, Kept] = OrderedDict()
        self._accepted: OrderedDict[bytes, None] = OrderedDict()
        self._compiling: dict[bytes, asyncio.Future[None]] = {}
        self._callers: OrderedDict[str, CallerCompiles] = OrderedDict()
        self._setup: asyncio.Future[Setup] | None = None
        self._pool = CompilePool(self._set_up, limits.workers)
        self.compiles = 0
        self.faults = 0
        self.verifications = 0

    @property
    def killed(self) -> int:
        return self._pool.restarts

    def worker_pids(self) -> dict[int, str | None]:
        """Each compile worker's pid, and the caller compiling on it (None: idle)."""
        return self._pool.pids()

    def compiles_of(self, caller: str) -> CallerCompiles:
        return self._callers.get(caller) or CallerCompiles()

    def kept(self, params: SamplingParams) -> Kept | None:
        """The verdict kept for `params`' constraint, if any."""
        so = params.structured_outputs
        job = job_of(so) if so is not None else None
        return self._verdicts.get(_job_key(job)) if job is not None else None

    def start(self) -> None:
        """Starts the workers now (each takes seconds: it imports xgrammar), not at first use."""
        self._pool.start()

    async def _set_up(self) -> Setup:
        if self._setup is None:
            self._setup = asyncio.ensure_future(asyncio.to_thread(self._build_setup))
        try:
            return await asyncio.shield(self._setup)
        except Exception:
            self._setup = None  # the next worker tries again
            raise

    def _build_setup(self) -> Setup:
        tokenizer: Any = self._llm.tokenizer  # a Hugging Face tokenizer, as the backend's
        info = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=self._llm.model_config.get_vocab_size()
        )
        config = self._llm.vllm_config.structured_outputs_config
        memory = self.limits.memory_mib * MIB
        return Setup(info.serialize_json(), memory, not config.disable_any_whitespace)

    def close(self) -> None:
        self._pool.close()

    async def check(
        self, params: SamplingParams, caller: str = "", span: Span | None = None
    ) -> None:
        """Raises UncompilableConstraint when `params`' structured output does not compile
        within the budget, or vLLM's own check refuses it (none: nothing to check); a
        retryable GenerationError (ENGINE_UNAVAILABLE) when no verdict could be had for
        `caller` within its budget. With `span` (the prompt's), the check is a child span of
        it, saying whether the verdict was kept from an earlier compile."""
        so = params.structured_outputs
        if so is None:
            return
        if span is None:
            await self._checked(params, so, caller)
            return
        with child(span, "llm_gateway.constraint_check") as checking:
            job = job_of(so)
            cached = job is not None and _job_key(job) in self._verdicts
            if checking is not None:
                checking.set("llm_gateway.constraint.cached", cached)
            await self._checked(params, so, caller)

    async def _checked(
        self, params: SamplingParams, so: StructuredOutputsParams, caller: str
    ) -> None:
        job = job_of(so)
        if job is not None:
            error = await self._verdict(job, caller)
            if error is not None:
                message = f"The engine cannot hold output to this constraint: {error}"
                raise UncompilableConstraint(ErrorKind.UNPROCESSABLE, message)
        await self._verify(params)

    async def _verdict(self, job: Job, caller: str) -> str | None:
        key = _job_key(job)
        seconds = self.limits.seconds
        deadline = asyncio.get_running_loop().time() + seconds
        while (kept := self._verdicts.get(key)) is None:
            compiling = self._compiling.get(key)
            if compiling is None:
                return await self._compiled(key, job, caller, deadline, seconds)
            # The same constraint compiling for another request: its verdict is ours too, and
            # waiting for it costs no more than compiling it would. Its fault is not ours.
            try:
                async with asyncio.timeout_at(deadline):
                    await asyncio.shield(compiling)
            except TimeoutError:
                what = (
                    f"the same constraint compiling for another request did not finish within "
                    f"CONSTRAINT_COMPILE_SECONDS ({seconds:g} s)"
                )
                raise self._fault(caller, what) from None
        self._verdicts.move_to_end(key)
        return kept.error

    async def _compiled(
        self, key: bytes, job: Job, caller: str, deadline: float, seconds: float
    ) -> str | None:
        """The verdict on `job` from a worker, kept; a fault is raised, and nothing kept."""
        counts = self._counts(caller)
        try:
            async with self._pool.lease(caller, deadline, seconds) as lease:
                counts.most_waited_behind = max(counts.most_waited_behind, lease.behind)
                if (kept := self._verdicts.get(key)) is not None:  # kept while we waited
                    return kept.error
                done = asyncio.get_running_loop().create_future()
                mine = self._compiling.setdefault(key, done) is done
                try:
                    self.compiles += 1
                    counts.compiles += 1
                    kept = self._judged(await lease.ask(job, deadline))
                    self._keep(key, kept)
                finally:
                    if mine:
                        del self._compiling[key]
                    done.set_result(None)
        except CompileFault as e:
            raise self._fault(caller, str(e)) from None
        return kept.error

    def _judged(self, verdict: Verdict) -> Kept:
        if verdict.out_of_memory:
            mib = self.limits.memory_mib
            return Kept(
                "memory", f"compiling it needs more than {mib} MiB (CONSTRAINT_COMPILE_MEMORY_MIB)"
            )
        if verdict.error is not None:
            return Kept("uncompilable", verdict.error)
        return Kept("compiled", None)

    def _keep(self, key: bytes, kept: Kept) -> None:
        self._verdicts[key] = kept
        if len(self._verdicts) > _VERDICTS_KEPT:
            self._verdicts.popitem(last=False)

    def _counts(self, caller: str) -> CallerCompiles:
        counts = self._callers.pop(caller, None) or CallerCompiles()
        self._callers[caller] = counts  # the most recent last
        if len(self._callers) > _VERDICTS_KEPT:
            self._callers.popitem(last=False)
        return counts

    def _fault(self, caller: str, what: str) -> GenerationError:
        """No verdict: the caller may retry, and the next request compiles afresh."""
        self.faults += 1
        self._counts(caller).faults += 1
        message = (
            f"The constraint could not be checked now: {what}. That is no verdict on the "
            "constraint, and none is kept: retry"
        )
        return GenerationError(ErrorKind.ENGINE_UNAVAILABLE, message)

    async def _verify(self, params: SamplingParams) -> None:
        """vLLM's own check, on a request that carries the constraint alone; it only parses
        what compiled above, so its time is bounded too."""
        # verify() records the backend it chose on the constraint: a copy keeps `params` as
        # it was.
        assert params.structured_outputs is not None
        # Every request offering the same tools carries the same grammar: vLLM's check (an
        # EBNF parse) is deterministic for one engine, so an acceptance is kept.
        key = _constraint_key(params.structured_outputs)
        if key in self._accepted:
            self._accepted.move_to_end(key)
            return
        alone = SamplingParams(structured_outputs=copy.copy(params.structured_outputs))
        llm = self._llm
        config = llm.vllm_config
        self.verifications += 1
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
        self._accepted[key] = None
        if len(self._accepted) > _VERDICTS_KEPT:
            self._accepted.popitem(last=False)
