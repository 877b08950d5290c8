"""Whether the engine can hold a request's output to its constraint, asked before the request is
submitted, within a budget of time and memory.

The engine compiles a constraint (xgrammar, against the whole vocabulary) in a thread of its
own process, and vLLM gives up waiting on a regex after 5 s but cannot stop the thread: a
large constraint kept both cores busy for a minute after its refusal, and a large schema or
enum took the engine's memory past 10 GB. So the gateway compiles each constraint first, as
the engine's backend will, in a worker process (gateway/engine/compile_worker.py) whose
address space is capped at CONSTRAINT_COMPILE_MEMORY_MIB above its start and which is killed
past CONSTRAINT_COMPILE_SECONDS, or as soon as the request is gone: no compile outlives its
request. It runs inside the caller's admission slot, one compile at a time; a killed worker is
replaced at once. Verdicts are kept by the constraint's hash: a repeated constraint compiles
once, and a refused one is refused at once. What compiled here compiles in the engine within
the same budget. vLLM's own check (`SamplingParams.verify`: its backend's other refusals) then
runs on what compiled, off the event loop. The size limits before all this are
protocols/constraint_budget.py's.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import hashlib
import logging
import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import msgspec
import xgrammar
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import StructuredOutputsParams
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.structured_output.utils import choice_as_grammar, grammar_is_likely_lark

from gateway.engine.compile_worker import (
    HEADER_BYTES,
    Job,
    Ready,
    Setup,
    Verdict,
    frame_length,
)
from protocols.constraints import ANY_OBJECT, UncompilableConstraint
from protocols.errors import ErrorKind, GenerationError

log = logging.getLogger(__name__)
_VERDICTS_KEPT = 4096
MIB = 1 << 20


@dataclass(frozen=True)
class CompileLimits:
    seconds: float = 5.0
    memory_mib: int = 1024


def _constraint_key(so: StructuredOutputsParams) -> bytes:
    """`so`'s request fields (not what vLLM records on it: its backend), hashed."""
    fields = {f.name: getattr(so, f.name) for f in dataclasses.fields(so)}
    public = {name: value for name, value in fields.items() if not name.startswith("_")}
    return hashlib.sha256(msgspec.msgpack.encode(public)).digest()


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


class _Worker:
    """One compile_worker process and its pipes."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, setup: Setup) -> _Worker:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gateway.engine.compile_worker",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        worker = cls(process)
        try:
            worker._send(setup)
            msgspec.msgpack.decode(await worker._receive(), type=Ready)
        except BaseException:
            worker.kill()
            raise
        return worker

    def _send(self, message: msgspec.Struct) -> None:
        assert self.process.stdin is not None
        body = msgspec.msgpack.encode(message)
        self.process.stdin.write(len(body).to_bytes(HEADER_BYTES, "big") + body)

    async def _receive(self) -> bytes:
        assert self.process.stdout is not None
        header = await self.process.stdout.readexactly(HEADER_BYTES)
        return await self.process.stdout.readexactly(frame_length(header))

    async def ask(self, job: Job) -> Verdict:
        self._send(job)
        return msgspec.msgpack.decode(await self._receive(), type=Verdict)

    def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()


class ConstraintChecker:
    """The compile budget of one engine: its worker, and the verdicts so far. `compiles` and
    `killed` count compiles run and workers killed (deadline, memory, request gone);
    `verifications` vLLM's own checks run (a constraint it accepted is not checked again)."""

    def __init__(self, llm: AsyncLLM, limits: CompileLimits) -> None:
        self._llm = llm
        self.limits = limits
        self._verdicts: OrderedDict[bytes, str | None] = OrderedDict()
        self._accepted: OrderedDict[bytes, None] = OrderedDict()
        self._lock = asyncio.Lock()
        self._setup: Setup | None = None
        self._worker: asyncio.Task[_Worker] | None = None
        self._closed = False
        self.compiles = 0
        self.killed = 0
        self.verifications = 0

    def start(self) -> None:
        """Starts the worker now (it takes seconds: it imports xgrammar), not at first use."""
        if self._worker is None and not self._closed:
            self._worker = asyncio.create_task(self._started())

    async def _started(self) -> _Worker:
        if self._setup is None:
            self._setup = await asyncio.to_thread(self._build_setup)
        return await _Worker.start(self._setup)

    def _build_setup(self) -> Setup:
        tokenizer: Any = self._llm.tokenizer  # a Hugging Face tokenizer, as the backend's
        info = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=self._llm.model_config.get_vocab_size()
        )
        config = self._llm.vllm_config.structured_outputs_config
        memory = self.limits.memory_mib * MIB
        return Setup(info.serialize_json(), memory, not config.disable_any_whitespace)

    def _stop_worker(self) -> None:
        task, self._worker = self._worker, None
        if task is None:
            return
        if not task.done():
            task.cancel()
        elif not task.cancelled() and task.exception() is None:
            task.result().kill()

    def _replace_worker(self) -> None:
        self._stop_worker()
        self.killed += 1
        self.start()

    def close(self) -> None:
        self._closed = True
        self._stop_worker()

    async def check(self, params: SamplingParams) -> None:
        """Raises UncompilableConstraint when `params`' structured output does not compile
        within the budget, or vLLM's own check refuses it (none: nothing to check)."""
        so = params.structured_outputs
        if so is None:
            return
        job = job_of(so)
        if job is not None:
            error = await self._verdict(job)
            if error is not None:
                message = f"The engine cannot hold output to this constraint: {error}"
                raise UncompilableConstraint(ErrorKind.UNPROCESSABLE, message)
        await self._verify(params)

    async def _verdict(self, job: Job) -> str | None:
        key = hashlib.sha256(msgspec.msgpack.encode(job)).digest()
        if key in self._verdicts:
            self._verdicts.move_to_end(key)
            return self._verdicts[key]
        async with self._lock:
            if key in self._verdicts:
                return self._verdicts[key]
            error = await self._compiled(job)
        self._verdicts[key] = error
        if len(self._verdicts) > _VERDICTS_KEPT:
            self._verdicts.popitem(last=False)
        return error

    async def _compiled(self, job: Job) -> str | None:
        self.start()
        if self._worker is None:  # closed: the engine is shutting down
            raise GenerationError(ErrorKind.ENGINE_UNAVAILABLE, "The engine is shutting down")
        try:
            # Shielded: a request that leaves while the worker starts leaves it starting.
            worker = await asyncio.shield(self._worker)
        except Exception:
            self._worker = None  # the next request starts another
            raise
        self.compiles += 1
        seconds, mib = self.limits.seconds, self.limits.memory_mib
        try:
            verdict = await asyncio.wait_for(worker.ask(job), seconds)
        except TimeoutError:
            self._replace_worker()
            return f"compiling it takes longer than {seconds:g} s (CONSTRAINT_COMPILE_SECONDS)"
        except asyncio.IncompleteReadError:  # it died: past its address space, or killed
            self._replace_worker()
            return f"compiling it needs more than {mib} MiB (CONSTRAINT_COMPILE_MEMORY_MIB)"
        except BaseException:  # the request is gone: its compile goes with it
            self._replace_worker()
            raise
        if verdict.out_of_memory:
            self._replace_worker()
            return f"compiling it needs more than {mib} MiB (CONSTRAINT_COMPILE_MEMORY_MIB)"
        return verdict.error

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
